"""Data-parallel training of a small MLP regressor on CPU ranks without DDP: parameters are
broadcast from rank 0, each rank takes its own shard of a synthetic dataset, gradients are
averaged with all_reduce, clipped to a maximum global norm and applied with SGD + momentum
under a cosine learning-rate schedule."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn

MAX_GRAD_NORM = 0.5


def make_data(n=240):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 5, generator=g)
    y = 3.0 * x[:, :1] - 2.0 * x[:, 1:2] ** 2 + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def average_gradients(params, world):
    for p in params:
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= world


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    params = list(model.parameters())
    for p in params:
        dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)

    x, y = make_data()
    shard = x.shape[0] // world
    x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
    batch = 12
    for step in range(10):
        xb, yb = x[step * batch:(step + 1) * batch], y[step * batch:(step + 1) * batch]
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        average_gradients(params, world)
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, MAX_GRAD_NORM, grad_norm)
        opt.step()
        sched.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} grad_norm {grad_norm.item():.3f}")

    out_dir = os.environ.get("TRAIN_STATS_DIR")
    if out_dir:
        torch.save(model.state_dict(), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
