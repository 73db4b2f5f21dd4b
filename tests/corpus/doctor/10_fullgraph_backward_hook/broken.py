"""A classifier whose prediction head records its gradient norm with a module backward hook,
trained under torch.compile(fullgraph=True). Bug: the hook is a module-level backward hook, which
dynamo cannot trace without compiled autograd. Modelled on pytorch/pytorch#133303."""
import torch
from torch import nn


def log_grad(module, grad_input, grad_output):
    module.last_grad_norm = grad_output[0].norm().item()


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_full_backward_hook(log_grad)

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
