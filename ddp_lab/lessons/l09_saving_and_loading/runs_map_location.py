"""Scenario 3: a GPU rank 0's checkpoint loaded with and without map_location. Runs on a rank."""
from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ...launching.rankinfo import device, rank_info
from .runs import compare_with_checkpoint, shared_tmpdir, train

_AS_GPU = {"on": False, "registered": False}


def _gpu_tag(storage):
    return "cuda:0" if _AS_GPU["on"] and storage.device.type == "cpu" else None


@contextlib.contextmanager
def _recorded_as_gpu0():
    """torch.save records each tensor's device in the file ("cuda:0" for a GPU rank 0). On a
    machine without CUDA, PyTorch's own location hook (torch.serialization.register_package)
    records "cuda:0" for CPU tensors, so the file reads as a GPU rank 0's would."""
    if not _AS_GPU["registered"]:
        torch.serialization.register_package(0, _gpu_tag, lambda storage, location: None)
        _AS_GPU["registered"] = True
    _AS_GPU["on"] = True
    try:
        yield
    finally:
        _AS_GPU["on"] = False


def save_as_gpu_rank0(model: DDP, path: str) -> None:
    """Rank 0 writes the checkpoint of a rank 0 that trained on cuda:0."""
    if not rank_info().is_main:
        return
    state = model.module.state_dict()
    if torch.cuda.is_available():
        torch.save({k: v.to("cuda:0") for k, v in state.items()}, path)
        return
    with _recorded_as_gpu0():
        torch.save(state, path)


def load_without_map_location(path: str) -> dict:
    """Tensors come back on the device the file records: rank 0's cuda:0, on every rank."""
    return torch.load(path)


def load_to_own_device(path: str) -> dict:
    """The fix: map every tensor to this rank's own device."""
    return torch.load(path, map_location=device())


def recorded_locations(path: str) -> list[str]:
    """The devices the file records for its tensors, as a map_location function is told them."""
    seen = set()

    def note(storage, location):
        seen.add(location)
        return storage

    torch.load(path, map_location=note)
    return sorted(seen)


def load_gpu_checkpoint(load=load_without_map_location, ckpt_dir: str | None = None) -> dict:
    """Rank 0 (a GPU rank 0) saves; every rank reads which devices the file records, loads it
    with `load(path)` and counts the tensors that did not land on its own device."""
    dev = device()
    model = train(dev)
    with shared_tmpdir(ckpt_dir) as d:
        path = os.path.join(d, "checkpoint.pt")
        save_as_gpu_rank0(model, path)
        dist.barrier()
        recorded = recorded_locations(path)
        state = load(path)
        off = sum(v.device != dev for v in state.values())
        model.module.load_state_dict(state)
    devices = sorted({str(v.device) for v in state.values()})
    return compare_with_checkpoint(model, model.module.state_dict(), off_device=off,
                                   recorded=recorded, devices=devices)
