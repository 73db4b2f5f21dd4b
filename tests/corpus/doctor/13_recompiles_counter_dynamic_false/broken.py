"""An MLP that ramps its output in over the first steps with a Python step counter kept on the
module, trained under torch.compile(dynamic=False). Bug: the int attribute is a constant of the
graph, so every step recompiles. Modelled on pytorch/pytorch#128319 and meta-pytorch/torchrec#4338."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, warmup=100):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.warmup = warmup
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        ramp = min(1.0, self.calls / self.warmup)
        return self.fc2(torch.relu(self.fc1(x))) * ramp
