"""A small encoder that prints the mean of its hidden state on every call, as a debugging aid,
trained under torch.compile(fullgraph=True). Bug: print() in forward is a graph break, an error
under fullgraph. Modelled on pytorch/pytorch#93739 (prints, logging and warnings break graphs)."""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.out = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        print("hidden mean", h.mean())
        return self.out(h)
