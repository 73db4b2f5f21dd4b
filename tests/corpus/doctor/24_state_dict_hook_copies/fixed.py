"""The same layer, its state-dict hook exporting a view of the weight (.t(), no copy): the
in-place load of torch.distributed.checkpoint writes through the view into the parameter."""
import torch
from torch import nn


def export_linear_layout(module, state_dict, prefix, local_metadata):
    state_dict[prefix + "weight"] = state_dict.pop(prefix + "weight_t").t()  # a view


def import_linear_layout(state_dict, prefix, *args):
    if prefix + "weight" in state_dict:
        state_dict[prefix + "weight_t"] = state_dict.pop(prefix + "weight").t()


class TransposedLinear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight_t = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
        self.bias = nn.Parameter(torch.zeros(d_out))
        self._register_state_dict_hook(export_linear_layout)
        self._register_load_state_dict_pre_hook(import_linear_layout)

    def forward(self, x):
        return x @ self.weight_t + self.bias


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = TransposedLinear(16, 32)
        self.down = TransposedLinear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
