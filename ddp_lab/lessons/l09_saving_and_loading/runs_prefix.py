"""Scenario 2: the `module.` prefix of a DDP state_dict. Runs on a rank."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.parallel import DistributedDataParallel as DDP

from ...launching.rankinfo import device, rank_info
from .modules import Net
from .runs import compare_with_checkpoint, shared_tmpdir, train


def save_ddp_state_dict(model: DDP, path: str) -> None:
    """Saves the wrapper's state_dict: every key starts with `module.`."""
    if rank_info().is_main:
        torch.save(model.state_dict(), path)


def save_module_state_dict(model: DDP, path: str) -> None:
    """The fix: save the wrapped module's own state_dict, whose keys a plain Net expects."""
    if rank_info().is_main:
        torch.save(model.module.state_dict(), path)


def load_stripping_prefix(path: str, dev) -> dict:
    """The other fix, for checkpoints already written with the prefix: PyTorch's own helper."""
    state = torch.load(path, map_location=dev)
    consume_prefix_in_state_dict_if_present(state, "module.")
    return state


def reload_into_plain_model(save=save_ddp_state_dict, load=None, ckpt_dir: str | None = None) -> dict:
    """Train under DDP, save with `save`, and load the checkpoint into a plain `Net` (as an
    evaluation script or a single-GPU fine-tune does) with `load(path, dev)`."""
    dev = device()
    model = train(dev)
    with shared_tmpdir(ckpt_dir) as d:
        path = os.path.join(d, "checkpoint.pt")
        save(model, path)
        dist.barrier()
        state = load(path, dev) if load else torch.load(path, map_location=dev)
        keys = list(state)[:2]
        plain = Net().to(dev)
        plain.load_state_dict(state)  # strict=True: every key must match
    return compare_with_checkpoint(model, plain.state_dict(), keys=keys)
