"""The per-rank code of lesson 18's DataLoader scenario: one epoch over a dataset held as Python
objects (a list of lists of floats) or as one NumPy array, with 2 worker processes per rank.
`measured_step()` measures each worker (its resident and private memory) at the end of every
step. The workers are started by torch's DataLoader inside the rank and end with the epoch.
Every function here runs on a rank."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ...instruments.probes import current_rss_mb, measured_step

ROWS, FEATURES = 80_000, 16


class RowsAsObjects(Dataset):
    """Each row a Python list of Python floats: 80,000 lists and 1.3 million float objects,
    every one with a reference count that reading it changes."""

    def __init__(self, rows: int = ROWS):
        self.rows = np.random.default_rng(0).standard_normal((rows, FEATURES)).tolist()

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return torch.tensor(self.rows[i], dtype=torch.float32)


class RowsAsArray(Dataset):
    """The same rows in one float32 NumPy array: one object, one buffer that reading leaves
    untouched."""

    def __init__(self, rows: int = ROWS):
        self.rows = np.random.default_rng(0).standard_normal((rows, FEATURES)).astype(np.float32)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return torch.from_numpy(self.rows[i])


def load_epoch(as_objects: bool = True, workers: int = 2, batch_size: int = 1000) -> dict:
    """One shuffled epoch of this rank's shard through a DataLoader with `workers` forked worker
    processes; each step only sums its batch (the training step would go there). Returns the
    dataset's size in this rank's memory."""
    before = current_rss_mb()
    data = RowsAsObjects() if as_objects else RowsAsArray()
    dataset_mb = current_rss_mb() - before
    # Workers forked from the rank (Linux's default up to Python 3.13; 3.14 defaults to
    # forkserver, where each worker unpickles a whole copy of the dataset instead).
    loader = DataLoader(data, batch_size=batch_size, num_workers=workers,
                        sampler=DistributedSampler(data, shuffle=True, seed=0),
                        multiprocessing_context="fork")
    total = 0.0
    for x in loader:
        with measured_step():
            total += float(x.sum())
    return {"dataset_mb": dataset_mb, "batches": len(loader), "checksum": total}
