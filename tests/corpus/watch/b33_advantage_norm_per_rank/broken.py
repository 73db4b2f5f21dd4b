"""Policy-gradient fine-tuning of a small 4-action policy on logged bandit feedback with DDP:
64 logged (context, action, reward) triples, global batch 16, normalised advantages, 2 epochs."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 16
N_ACTIONS = 4


def make_logged_data(n=64):
    g = torch.Generator().manual_seed(11)
    ctx = torch.randn(n, 6, generator=g)
    actions = torch.randint(0, N_ACTIONS, (n,), generator=g)
    prefs = ctx @ torch.randn(6, N_ACTIONS, generator=g)
    rewards = prefs.gather(1, actions[:, None]).squeeze(1) + 0.5 * torch.randn(n, generator=g) + 2.0
    return TensorDataset(ctx, actions, rewards)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    policy = DDP(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, N_ACTIONS)))
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    ds = make_logged_data()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for ctx, actions, rewards in loader:
            logp = torch.log_softmax(policy(ctx), dim=-1).gather(1, actions[:, None]).squeeze(1)
            adv = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
            loss = -(adv * logp).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} pg loss {loss.item():.4f} mean reward {rewards.mean().item():.3f}")

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(policy.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
