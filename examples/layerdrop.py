"""An encoder with LayerDrop (fairseq's: each layer skipped at random while training), for the
doctor's example in docs/doctor.md (`ddp-lab doctor layerdrop.py:Encoder ... --ddp find_unused_parameters=True`).

Each rank draws its own layers to skip, so the parameters that get no gradient differ by rank
and by step: under DDP's defaults that is an error, and under `find_unused_parameters=True`
(how LayerDrop is trained) the doctor reports it as information only.
"""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 4, p: float = 0.5):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 4, dim * 2, batch_first=True) for _ in range(layers))
        self.p, self.head = p, nn.Linear(dim, 4)

    def forward(self, x):
        for layer in self.layers:
            if not self.training or torch.rand([]) >= self.p:
                x = layer(x)
        return self.head(x)
