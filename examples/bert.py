"""A BERT-style encoder for the doctor's example in docs/doctor.md (`ddp-lab doctor bert.py:Encoder ...`).

It returns (token logits, pooled output), as BERT does. Trained with a masked-LM loss on the token
logits alone, its pooler gets no gradient: under DDP's defaults that is the "unused parameters"
error, and the doctor names `pooler.weight` and `pooler.bias` before a training job meets it.
"""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm = nn.Linear(dim, vocab)     # token logits: the masked-LM loss reads these
        self.pooler = nn.Linear(dim, dim)    # the [CLS] summary: a masked-LM loss never reads it

    def forward(self, ids):
        h = self.encoder(self.emb(ids))
        return self.mlm(h), torch.tanh(self.pooler(h[:, 0]))
