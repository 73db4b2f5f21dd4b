"""A classifier whose prediction head records its gradient norm, trained under
torch.compile(fullgraph=True). Fix: the norm is taken by a hook on the head's weight (it runs
when the gradient is accumulated, outside the graph), not a module backward hook. Modelled on
pytorch/pytorch#133303."""
import torch
from torch import nn


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.fc.weight.register_post_accumulate_grad_hook(self.log_grad)

    def log_grad(self, weight):
        self.last_grad_norm = weight.grad.norm().item()

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = Head()
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        x = self.head(x)
        return self.fc2(torch.relu(self.fc1(x)))
