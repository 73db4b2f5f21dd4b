"""Fine-tune a small classifier with DDP on 2 CPU ranks, starting from pretrained weights.
Bug: only rank 0 loads the weights, after DDP(...): DDP broadcasts rank 0's state only at construction.
Modelled on https://github.com/facebookresearch/detr/issues/235 and https://discuss.pytorch.org/t/preferred-way-of-loading-checkpoint-with-ddp-training/187470."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def pretrained_state():
    """Stands for torch.load("pretrained.pt"): weights another run trained."""
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        return make_model().state_dict()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = make_model()
    model = DDP(model)
    if rank == 0:  # load once, not once per rank
        model.module.load_state_dict(pretrained_state())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(4):
        x = torch.randn(16, 8, generator=gen)
        y = torch.randint(0, 4, (16,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
