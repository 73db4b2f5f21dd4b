"""Multi-process training with torchrun: a Trainer that snapshots and resumes.

Run: torchrun --standalone --nproc-per-node 2 correct.py
"""
import argparse
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RegressionSet(Dataset):
    """A fixed synthetic regression problem (the same on every process)."""

    def __init__(self, size, dim=20):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.rand(size, dim, generator=g)
        w = torch.randn(dim, 1, generator=g)
        self.y = self.x @ w + 0.01 * torch.randn(size, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def ddp_setup():
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            if self.local_rank == 0:
                print("loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, path):
        snapshot = torch.load(path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        if self.local_rank == 0:
            print(f"resuming from snapshot at epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        out = self.model(source)
        loss = F.mse_loss(out, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        total = 0.0
        for source, targets in self.train_data:
            total += self._run_batch(source, targets)
        if self.local_rank == 0:
            print(f"epoch {epoch} | steps {len(self.train_data)} | mean loss {total / len(self.train_data):.4f}")

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"epoch {epoch} | snapshot saved")

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and (epoch + 1) % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = RegressionSet(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))


def main(save_every, total_epochs, batch_size):
    ddp_setup()
    workdir = tempfile.mkdtemp() if int(os.environ["RANK"]) == 0 else None
    box = [workdir]
    dist.broadcast_object_list(box, src=0)
    snapshot_path = os.path.join(box[0], "snapshot.pt")
    # the job is stopped half way and started again: the second start resumes from the snapshot
    for stop_at in (total_epochs // 2, total_epochs):
        dataset, model, optimizer = load_train_objs()
        train_data = prepare_dataloader(dataset, batch_size)
        trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
        trainer.train(stop_at)
        dist.barrier()
    if int(os.environ["RANK"]) == 0:
        shutil.rmtree(box[0], ignore_errors=True)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, nargs="?", default=4)
    parser.add_argument("save_every", type=int, nargs="?", default=2)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size)
