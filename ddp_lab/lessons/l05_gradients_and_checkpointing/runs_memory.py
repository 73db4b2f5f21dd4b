"""Two memory measurements lesson 05 needs beside `ddp_lab.instruments.probes`: the bytes autograd still
holds for backward at any moment, and a peak resident memory that can be reset.

Both measure; neither changes what training computes.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ...instruments.probes import current_rss_mb, peak_rss_mb


@dataclass
class Held:
    """`bytes`: saved for backward inside the block and not yet let go by autograd."""

    bytes: int = 0
    saved: int = 0  # every byte ever saved inside the block

    def _release(self, n: int) -> None:
        self.bytes -= n


class _Saved:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


@contextmanager
def held_saved_bytes():
    """Count, at any moment, the bytes of the tensors autograd saved inside the block that it
    still holds: a saved tensor is let go when its graph is freed (after backward, unless
    retain_graph=True) or garbage-collected.

        with held_saved_bytes() as held:
            for step in ...: train_step(); print(held.bytes)
    """
    box = Held()

    def pack(t):
        n = t.numel() * t.element_size()
        box.bytes += n
        box.saved += n
        holder = _Saved(t)
        weakref.finalize(holder, box._release, n)
        return holder

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda holder: holder.tensor):
        yield box


def reset_peak_rss() -> bool:
    """Start this process's peak resident memory afresh (Linux: /proc/self/clear_refs), so
    `peak_rss_mb()` measures from now on. False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_mb(dev) -> float:
    """The memory this rank's tensors live in, now, in MiB: resident memory on the CPU,
    allocated GPU memory on CUDA."""
    if dev.type == "cuda":
        return torch.cuda.memory_allocated(dev) / 2 ** 20
    return current_rss_mb()


@contextmanager
def peak_growth(dev=None):
    """The growth of peak memory inside the block, in MiB (`growth.mb` after it): resident
    memory on the CPU, GPU memory on CUDA. `growth.exact` is False where the peak could not be
    reset (then it is the peak since the process started)."""
    box = _Growth()
    if dev is not None and dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
        box.exact, start = True, torch.cuda.memory_allocated(dev) / 2 ** 20
        peak = lambda: torch.cuda.max_memory_allocated(dev) / 2 ** 20  # noqa: E731
    else:
        box.exact = reset_peak_rss()
        start, peak = (current_rss_mb() if box.exact else peak_rss_mb()), peak_rss_mb
    try:
        yield box
    finally:
        box.mb = peak() - start


@dataclass
class _Growth:
    mb: float = 0.0
    exact: bool = False


def slope(values, start: int = 0) -> float:
    """Least-squares slope of `values[start:]` against their index (units per step)."""
    ys = list(values)[start:]
    n = len(ys)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    num = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(ys))
    return num / sum((i - mean_x) ** 2 for i in range(n))
