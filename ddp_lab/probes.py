"""Measurements taken inside a rank: how far ranks have drifted apart, which collectives ran when,
how much memory a step holds. Probes measure; they never start processes or change training.

Every function here that talks to other ranks is itself a collective: call it on every rank.
"""
from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


def tensor_drift(t) -> float:
    """max |t_this_rank - t_rank0| over every element, the same on every rank (a collective)."""
    import torch.distributed as dist

    ref = t.detach().clone().float()
    dist.broadcast(ref, src=0)
    diff = (t.detach().float() - ref).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff)


def named_drift(tensors: dict) -> dict[str, float]:
    """`tensor_drift` of each named tensor, e.g. `dict(module.named_parameters())`."""
    return {name: tensor_drift(t) for name, t in tensors.items()}


def module_drift(module) -> float:
    """The largest drift of any parameter or buffer of `module` between ranks (a collective)."""
    values = named_drift({**dict(module.named_parameters()), **dict(module.named_buffers())})
    return max(values.values(), default=0.0)


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (a collective)."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux /proc; peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return peak_rss_mb()


@contextmanager
def saved_tensor_bytes():
    """Count the bytes autograd saves for backward inside the block.

        with saved_tensor_bytes() as saved:
            loss = model(x).sum()
        saved.bytes
    """
    import torch

    box = _Counter()

    def pack(t):
        box.bytes += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield box


@dataclass
class _Counter:
    bytes: int = 0


@dataclass
class Timeline:
    """Spans recorded inside a rank (name, start, end in seconds since the timeline began);
    the rank returns `timeline.spans` and a plot draws every rank's spans as a Gantt chart."""

    spans: list[tuple[str, float, float]] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    @contextmanager
    def span(self, name: str):
        start = time.perf_counter() - self.t0
        try:
            yield
        finally:
            self.spans.append((name, start, time.perf_counter() - self.t0))

    def align(self) -> None:
        """Start the clock on every rank together (a barrier, then reset)."""
        import torch.distributed as dist

        dist.barrier()
        self.t0 = time.perf_counter()


_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "barrier",
                "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all", "gather",
                "scatter", "send", "recv", "all_gather_object", "broadcast_object_list",
                "monitored_barrier")


@contextmanager
def record_collectives(timeline: Timeline | None = None):
    """Record every `torch.distributed.<collective>` called through the module inside the block,
    as spans on `timeline` (a new one by default). DDP's own gradient all-reduces go through
    C++ and are not seen here: count those with a communication hook.

        with record_collectives() as tl:
            step()
        tl.spans  ->  [("all_reduce", 0.01, 0.03), ...]
    """
    import torch.distributed as dist

    tl = timeline or Timeline()
    saved = {}
    for name in _COLLECTIVES:
        if hasattr(dist, name):
            saved[name] = getattr(dist, name)
            setattr(dist, name, _recorded(name, saved[name], tl))
    try:
        yield tl
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _recorded(name, fn, tl: Timeline):
    def call(*args, **kwargs):
        with tl.span(name):
            return fn(*args, **kwargs)

    call.__wrapped__ = fn
    return call
