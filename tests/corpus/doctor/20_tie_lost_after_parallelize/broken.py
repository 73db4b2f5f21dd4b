"""A tiny language model whose output head shares the embedding's weight (tied, as GPT-2 and
OPT are), split with tensor parallelism. parallelize_module gives each split module new DTensor
parameters, so after it head.weight and embed.weight are two tensors trained apart."""
import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)


class TiedLM(nn.Module):
    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def parallelize(model, mesh):
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()), "head": ColwiseParallel(output_layouts=Replicate())}
    parallelize_module(model, mesh, plan)
    return model
