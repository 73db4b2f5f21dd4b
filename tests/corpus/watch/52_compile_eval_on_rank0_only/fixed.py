"""Train a small MLP under torch.compile(DDP(...)) on 2 CPU ranks and evaluate it every other step.
Fix: every rank evaluates (rank 0 alone prints): the ranks compile the eval graph in the same step.
Modelled on https://github.com/huggingface/pytorch-image-models/issues/2693 and https://github.com/karpathy/nanochat/pull/722."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.compile(DDP(Net()), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    xv, yv = torch.randn(8, 8, generator=torch.Generator().manual_seed(99)), torch.arange(8) % 2
    for step in range(4):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 1:
            model.eval()
            with torch.no_grad():
                val = nn.functional.cross_entropy(model(xv), yv)
            if rank == 0:
                print(f"step {step}: val loss {val.item():.4f}")
            model.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
