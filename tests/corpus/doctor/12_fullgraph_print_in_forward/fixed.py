"""A small encoder that prints the mean of its hidden state when it runs eagerly, trained under
torch.compile(fullgraph=True). Fix: the print is skipped while dynamo traces
(torch.compiler.is_compiling()). Modelled on pytorch/pytorch#93739."""
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.out = nn.Linear(32, 8)

    def forward(self, x):
        h = torch.tanh(self.proj(x))
        if not torch.compiler.is_compiling():
            print("hidden mean", h.mean())
        return self.out(h)
