"""Measurements taken inside a rank: how far ranks have drifted apart, which collectives ran when,
how much memory a step holds. Probes measure; they never start processes or change training.

Every function here that talks to other ranks is itself a collective: call it on every rank.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


# ---- comparing ranks -------------------------------------------------------------------------
# `named_drift` compares many tensors in one broadcast and one all-reduce; `tensor_drift` and
# `module_drift` are its one-tensor and whole-module forms; `gather` is all_gather_object. The
# doctor passes a process group of its own; lessons use the world's.
def tensor_drift(t, group=None) -> float:
    """max |t_this_rank - t_rank0| over every element, the same on every rank (a collective)."""
    value = named_drift({"t": t}, group)["t"]
    return float("inf") if value is None else value


def module_drift(module) -> float:
    """The largest drift of any parameter or buffer of `module` between ranks (a collective)."""
    values = named_drift({**dict(module.named_parameters()), **dict(module.named_buffers())})
    return max((float("inf") if v is None else v for v in values.values()), default=0.0)


def gather(obj, group=None) -> list:
    """Every rank's `obj`, in rank order, on every rank (a collective).

    `obj` is pickled (names, shapes, small dicts); `group` is a process group, the world by
    default. The doctor passes a gloo group of its own, so that a module whose collectives are
    out of step with the other ranks cannot pair them with its comparisons. Tensors inside
    `obj` travel through pickle too: send small ones only, and compare big ones with
    `named_drift`."""
    import torch.distributed as dist

    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def named_drift(tensors: dict, group=None) -> dict[str, float | None]:
    """{name: max |this rank - rank 0|, the largest over ranks} for each named tensor, e.g.
    `dict(module.named_parameters())`, in one broadcast and one all-reduce (a collective).
    Equal infinities count as equal; a NaN counts as infinitely far. A name that some rank
    lacks, or holds in another shape, maps to None."""
    import torch
    import torch.distributed as dist

    shapes = {n: list(t.shape) for n, t in tensors.items()}
    everyone = gather(shapes, group)
    common = [n for n in tensors if all(s.get(n) == shapes[n] for s in everyone)]
    result: dict = {n: None for s in everyone for n in s if n not in common}
    if not common:
        return result
    dev = "cpu" if group is not None else tensors[common[0]].device  # the doctor's group is gloo
    flat = torch.cat([tensors[n].detach().float().reshape(-1).to(dev) for n in common])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=group)
    gap = torch.where(flat == ref, torch.zeros_like(flat), (flat - ref).abs())
    diffs, start = [], 0
    for n in common:
        size = tensors[n].numel()
        diffs.append(gap[start:start + size].max() if size else gap.new_zeros(()))
        start += size
    vec = torch.nan_to_num(torch.stack(diffs), nan=float("inf"))
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
    result.update({n: float(v) for n, v in zip(common, vec.tolist())})
    return result


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


# ---- what a step costs: RankResult.steps (ddp_lab.launching.costs reads them) --------------------------
@contextmanager
def measured_step():
    """Mark one step of this rank's loop; the launcher returns the marks as `RankResult.steps`:

        for x, y in loader:
            with measured_step():
                loss = ...; loss.backward(); opt.step()
        # then, in the launching process:
        result.ranks[0].collectives_per_step()    # from the flight recorder, by step
        [s.peak_mb for s in result.ranks[0].steps]

    Each step records when it ran, this process's resident memory when it began and ended and
    the highest inside it (Linux: the kernel's high-water mark, reset as the step begins), the
    world group's collective count at both ends (so the flight recorder's collectives fall into
    steps by sequence number), and the memory of each child process (DataLoader workers) when it
    ended. It adds about 0.2 ms to a step, and about 2 ms for each child process it reads
    (benchmarks/measured_step_cost.py)."""
    from ..launching import child as _rank

    peak_before, exact = _high_water_mb(), _reset_high_water()
    seq_start, rss_start, start = world_seq(), current_rss_mb(), time.time()
    try:
        yield
    finally:
        step = {"start": start, "end": time.time(), "rss_start_mb": rss_start,
                "rss_mb": current_rss_mb(), "peak_mb": _high_water_mb() if exact else peak_rss_mb(),
                "seq_start": seq_start, "seq_end": world_seq(), "children": children_memory()}
        _rank.record_step(step, peak_before)


def _high_water_mb() -> float:
    """This process's peak resident memory since it started or since the high-water mark was
    last reset (Linux /proc; getrusage's peak elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return peak_rss_mb()


def _reset_high_water() -> bool:
    """Linux: start the kernel's peak resident memory of this process afresh (clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def world_seq() -> int | None:
    """How many collectives the world group has entered: the number the flight recorder gives
    the last one (`collective_seq_id`; gloo and NCCL, torch 2.13). None without a group."""
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_group

        if dist.is_initialized():
            return int(_get_default_group()._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a private API: without it, steps place collectives by time
        pass
    return None


def children_memory() -> list[dict]:
    """Each child process of this one (Linux): pid, resident memory, and private memory (pages
    no other process maps: a forked worker's copied pages), in MiB."""
    pids = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue  # the thread ended, or the kernel has no children file
    out = []
    for pid in pids:
        fields = _smaps_rollup(pid)
        if fields:
            out.append({"pid": pid, "rss_mb": fields.get("Rss", 0) / 1024,
                        "private_mb": (fields.get("Private_Clean", 0)
                                       + fields.get("Private_Dirty", 0)) / 1024})
    return out


def _smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup's fields in KiB; empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0])
    return out


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
