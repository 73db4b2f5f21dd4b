"""An MLP that ramps its output in over the first steps, trained under
torch.compile(dynamic=False). Fix: the step counter is a buffer updated in place, a tensor the
graph reads, not an int it specialises on. Modelled on pytorch/pytorch#128319."""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, warmup=100):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.warmup = warmup
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        ramp = (self.calls / self.warmup).clamp(max=1.0)
        return self.fc2(torch.relu(self.fc1(x))) * ramp
