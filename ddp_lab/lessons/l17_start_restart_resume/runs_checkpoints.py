"""Scenario 6: a checkpoint cut mid-write. Launch 1 trains and checkpoints every EVERY steps; while
rank 0 writes the checkpoint of step CUT_AT it is killed. Launch 2, the restart, resumes from the
checkpoint its `pick` chooses. Every function here runs on a rank."""
from __future__ import annotations

import os
import re
import resource
import signal

import torch
import torch.distributed as dist
from torch import nn

from ...launching.rankinfo import rank_info
from .runs import refuse_under_torchrun

EVERY, CUT_AT, STEPS = 2, 6, 8
NAME = re.compile(r"ckpt-(\d+)\.pt$")


# -- writing ----------------------------------------------------------------------------------

def save_in_place(state: dict, path: str) -> None:
    torch.save(state, path)


def save_atomically(state: dict, path: str) -> None:
    """Write a temporary file beside `path`, then rename it: the name points at the previous file
    or at the whole new one, never at half of one. Python documents os.replace as atomic on POSIX,
    within one file system; the fsync puts the bytes on disk before the name can point at them, as
    DCP's FileSystemWriter does (sync_files=True)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def cut_after(nbytes: int, kill: bool = True) -> None:
    """The kill, made to land mid-write every time: the kernel stops this process (SIGXFSZ) when
    a file it writes grows past `nbytes`. A SIGKILL from the scheduler, the OOM killer or a power
    cut at that moment leaves the same file. `kill=False` keeps what CPython sets at start-up,
    SIGXFSZ ignored: the write past the limit then fails instead (EFBIG), and torch.save raises."""
    if kill:  # CPython ignores SIGXFSZ (signal.getsignal gives SIG_IGN); the default action kills
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def train_and_checkpoint(workdir: str, save=save_in_place, kill: bool = True, **_) -> dict:
    """Launch 1: STEPS steps, a checkpoint every EVERY steps written by rank 0; rank 0 is killed
    while it writes the one of step CUT_AT (`kill=False`: its write fails there instead)."""
    refuse_under_torchrun("torn_checkpoint", "it kills the rank that writes, and under torchrun "
                          "that rank is the process running ddp-lab")
    model, opt = _model()
    for step in range(1, STEPS + 1):
        _step(model, opt)
        if step % EVERY == 0:
            if rank_info().is_main:
                if step == CUT_AT:
                    cut_after(os.path.getsize(os.path.join(workdir, f"ckpt-{step - EVERY}.pt")) // 2, kill)
                save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                     os.path.join(workdir, f"ckpt-{step}.pt"))
            dist.barrier()
    return {"steps": STEPS}


# -- reading ----------------------------------------------------------------------------------

def latest_file(workdir: str) -> tuple[int, dict]:
    """The newest checkpoint file, by its step number."""
    steps = sorted(int(m.group(1)) for f in os.listdir(workdir) if (m := NAME.match(f)))
    return steps[-1], torch.load(os.path.join(workdir, f"ckpt-{steps[-1]}.pt"))


def latest_complete(workdir: str) -> tuple[int, dict]:
    """The newest checkpoint that loads, newest first: a torn file (from an older script, a copy
    cut short) is skipped, not trusted."""
    steps = sorted((int(m.group(1)) for f in os.listdir(workdir) if (m := NAME.match(f))), reverse=True)
    for step in steps:
        try:
            return step, torch.load(os.path.join(workdir, f"ckpt-{step}.pt"))
        except (RuntimeError, EOFError):  # PyTorch's "failed reading zip archive", an empty file
            continue
    return 0, {}


def resume(workdir: str, pick=latest_file, **_) -> dict:
    """Launch 2, the restart: every rank loads the checkpoint `pick` chooses, then trains on."""
    model, opt = _model()
    step, ckpt = pick(workdir)
    if ckpt:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    for _ in range(step, STEPS):
        _step(model, opt)
    return {"resumed_from": step, "files": {f: os.path.getsize(os.path.join(workdir, f))
                                            for f in sorted(os.listdir(workdir)) if f.startswith("ckpt")}}


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64))  # ~0.3 MB a checkpoint
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model, opt) -> None:
    x = torch.randn(16, 64)
    loss = (model(x) - x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():  # the gradients of every rank, averaged
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
