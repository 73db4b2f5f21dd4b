"""Train a small MLP under DDP on 2 CPU ranks with a compiled optimizer step and a LambdaLR schedule.
Fix: lr=torch.tensor(0.1), which the scheduler updates in place: an input of the compiled step, compiled once.
Modelled on https://github.com/pytorch/pytorch/issues/107076 and https://github.com/pytorch/pytorch/issues/120934."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=torch.tensor(0.1))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9 ** s)

    @torch.compile(backend="aot_eager")
    def opt_step():
        opt.step()

    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt_step()
        sched.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
