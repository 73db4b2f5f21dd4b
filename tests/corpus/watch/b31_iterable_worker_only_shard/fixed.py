"""Train a small classifier with DDP from a streamed record source (an IterableDataset read by
2 DataLoader workers), 4 records per rank per step, one pass over 32 records."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

N_RECORDS = 32


class RecordStream(IterableDataset):
    def __init__(self, n_records, rank, world_size):
        self.rank, self.world_size = rank, world_size
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n_records, 10, generator=g)
        self.y = (self.x[:, :3].sum(dim=1) > 0).long()

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        start, stride = self.rank * nw + wid, self.world_size * nw
        for i in range(start, len(self.x), stride):
            yield self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    model = DDP(nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(RecordStream(N_RECORDS, rank, dist.get_world_size()), batch_size=4, num_workers=2)

    step = 0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
    if rank == 0:
        print(f"finished after {step} steps")

    if os.environ.get("STATE_DUMP_DIR"):
        torch.save(model.module.state_dict(), os.path.join(os.environ["STATE_DUMP_DIR"], f"rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
