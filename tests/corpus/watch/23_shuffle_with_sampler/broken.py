"""Train a small classifier with DDP on 2 CPU ranks; the sampler is a DistributedSampler when distributed.
Bug: the DataLoader keeps shuffle=True next to sampler=, which DataLoader refuses with a ValueError on every rank.
Modelled on https://github.com/ultralytics/yolov3/issues/231 and https://github.com/NVIDIA/tacotron2/issues/168."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    distributed = dist.get_world_size() > 1
    g = torch.Generator().manual_seed(3)
    features = torch.randn(40, 5, generator=g)
    dataset = TensorDataset(features, (features.mean(dim=1) > 0).long())
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(5, 10), nn.ReLU(), nn.Linear(10, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = DistributedSampler(dataset) if distributed else None
    dataloader = DataLoader(dataset, batch_size=10, shuffle=True, sampler=sampler)
    for epoch in range(2):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for xb, yb in dataloader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    if dist.get_rank() == 0:
        print(f"final loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
