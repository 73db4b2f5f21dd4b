"""A tiny language model whose output head shares the token embedding's weight, sharded with FSDP2
one unit per child (embedding, block, head). Bug: the tied weight belongs to two units, which
FSDP2 refuses or shards twice. Modelled on huggingface/accelerate#4171 and pytorch/pytorch#176076."""
import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.block(self.embed(ids)))
