"""The samples check's fingerprint of what each data-parallel replica trains on (samples.py), on
each rank: a hash of each row of the first tensor a data-parallel model's forward takes in
training mode (grad enabled), whatever made it (a DataLoader over any dataset, an
IterableDataset, a generator, a hand-made shard). A row is a sample; two replicas that train on
the same rows in one epoch train on the same samples twice (the judge: _samples_overlap.py).

Rows are grouped into segments, per model: the DataLoader epoch whose iterator yielded during the
step (its line and its ordinal among the epochs of loaders made at that line), else the step. The
hash is a dot product of the row's values (their bits, a strided sample of at most COLS of them)
with fixed odd 64-bit weights, wrapping: a few array operations per forward, on the CPU in numpy
(no copy of the batch), elsewhere on the tensor's device, read back at the run's end (no sync).
"""
from __future__ import annotations

import re
import zlib

from ..userline import line_in_function

KEY = "samples-rows"
ROWS = 64  # rows hashed per forward (its first)
COLS = 256  # values hashed per row: a strided sample of a longer row
KEPT = 8192  # row hashes kept per rank (the first); later rows are counted only
SEGMENTS = 4096  # segments kept per rank
MIN_VALUES = 2  # a row of one value (a label, an id) does not tell samples apart
# the line of the user's IterableDataset.__iter__ that splits its records, by what it reads
SPLITS = (re.compile(r"num_workers|num_shards|world_size|num_replicas|get_world_size"),
          re.compile(r"get_worker_info|worker_id|\brank\b|get_rank"),
          re.compile(r"^\s*(for|yield)\b"))


def split_line(ctx, ds) -> str:
    """The line of the user's `__iter__` that decides which records this process reads (the
    split by worker or rank; else its loop over the records); "" when it is not the user's."""
    fn = getattr(type(ds), "__iter__", None)
    code = getattr(fn, "__code__", None)
    if code is None or not ctx.is_user_file(code.co_filename):
        return ""
    for pattern in SPLITS:
        found = line_in_function(fn, pattern)
        if found:
            return found
    return ""


def group_of(w) -> list | None:
    """The ranks of the data-parallel group a wrapped model replicates over: DDP's process
    group; FSDP2's mesh (its dimensions are data-parallel unless it is a full SPMD mesh)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ddp = w.wrapper if w.kind == "ddp" else w.module if w.kind == "compiled" else None
    if isinstance(ddp, DistributedDataParallel):
        return dist.get_process_group_ranks(ddp.process_group)
    if w.kind == "fsdp2":  # the mesh fully_shard was given, read off any managed module's state
        for m in w.module.modules():
            groups = getattr(m, "_get_fsdp_state", lambda: None)()
            for g in getattr(groups, "_fsdp_param_groups", None) or []:
                if not getattr(g.mesh_info, "is_spmd_mesh", False):
                    return g.mesh_info.mesh.mesh.flatten().tolist()
                return None
    return None


class Rows:
    """One rank's row hashes per segment; plain data at the end (`emit`)."""

    def __init__(self, ctx, samples):
        self.ctx, self.samples = ctx, samples
        self.segments: dict = {}
        self.kept = 0
        self.last = None
        self.line = ""  # the line of the first forward outside a DataLoader epoch
        self.weights: dict = {}

    def model(self, ctx, w) -> None:
        import torch

        group = group_of(w)
        if group is None or len(group) < 2 or ctx.rank not in group:
            return
        target = w.module if w.kind == "fsdp2" else w.wrapper
        compiling, record = torch.compiler.is_compiling, ctx.guard(self.record)

        def hook(module, args, kwargs):
            if compiling():  # traced inside a compiled caller: its eager caller hashes
                return None
            if module.training and torch.is_grad_enabled():
                record(w, group, args, kwargs, handle)
            return None

        handle = target.register_forward_pre_hook(ctx.user_hook(hook, guarded=False),
                                                   with_kwargs=True)

    def record(self, w, group, args, kwargs, handle) -> None:
        if w.kind == "fsdp2" and not any(m.module is w.module for m in self.ctx.models):
            handle.remove()  # an inner fully_shard'ed module: its input is an activation
            return
        t = _first_tensor(args, kwargs)
        if t is None or t.dim() < 1 or not t.shape[0]:
            return
        key = (t.data_ptr(), tuple(t.shape), self.ctx.step)
        if key == self.last:  # the same input met again (a wrapper around a wrapper)
            return
        self.last = key
        seg = self._segment(w, group)
        if seg is None:
            return
        seg["n"] += t.shape[0]
        base = t._base  # a slice of a larger tensor: batches cut from a data set in memory
        seg["view"] = seg["view"] or (base is not None and base.numel() > t.numel())
        if self.kept < KEPT:
            h = row_hashes(t, self.weights)
            if h is not None:  # None: rows of one value, or a tensor whose rows are not read
                seg["rows"].append(h)
                self.kept += min(ROWS, t.shape[0])

    def _segment(self, w, group) -> dict | None:
        cur, step = self.samples.current, self.ctx.step
        if cur is not None and cur["end"] == step:
            tag = ("epoch", cur["rec"]["line"], cur["k"])
        else:  # with the DataLoader that yielded in the step before (a batch fetched ahead)
            near = cur is not None and cur["end"] == step - 1
            tag = ("step", cur["rec"]["line"] if near else "", step)
        seg = self.segments.get((w.line, tag))
        if seg is None:
            if len(self.segments) >= SEGMENTS:
                return None
            if tag[0] == "step" and not self.line:
                self.line = self.ctx.user_line()
            seg = self.segments[(w.line, tag)] = {"tag": list(tag), "model": w.line, "n": 0,
                                                  "group": group, "rows": [], "step": step,
                                                  "view": False}
        return seg

    def emit(self, ctx) -> None:
        out = []
        for seg in self.segments.values():
            rows = []
            for h in seg["rows"]:
                rows += h if isinstance(h, list) else h.tolist()
            out.append(dict(seg, rows=rows))
        ctx.emit(KEY, {"line": self.line, "segments": out})


def _first_tensor(args, kwargs):
    import torch

    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor):
            return v
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
            return v[0]
        if isinstance(v, dict):
            first = next((x for x in v.values() if isinstance(x, torch.Tensor)), None)
            if first is not None:
                return first
    return None


_INTS = {8: "int64", 4: "int32", 2: "int16", 1: "uint8"}
_U64 = (1 << 64) - 1
SMALL = 256  # values hashed at most in plain Python (_on_cpu)


def row_hashes(t, weights: dict):
    """A 48-bit hash of each of the first ROWS rows of `t` (a list; a tensor on its device for a
    tensor that is not on the CPU); None for rows of fewer than MIN_VALUES values."""
    import torch

    if type(t) is not torch.Tensor or t.layout != torch.strided:
        return None  # a DTensor's, a sparse or nested tensor's rows are not read
    x = t.detach()
    x = x[:ROWS] if x.shape[0] > ROWS else x  # (each torch call here costs a few us a step)
    flat = x if x.dim() == 2 else x.reshape(x.shape[0], -1)
    n = flat.shape[1]
    size = flat.element_size()
    if n < MIN_VALUES or size not in _INTS or flat.is_complex():
        return None
    if n > COLS:
        flat = flat[:, ::-(-n // COLS)]
    bits = flat.view(getattr(torch, _INTS[size]))
    salt = weights.get((n, t.dtype))
    if salt is None:  # the same on every rank
        salt = weights[(n, t.dtype)] = zlib.crc32(f"{n} {t.dtype}".encode()) & 0xFFFF
    if bits.device.type == "cpu":
        return _on_cpu(bits, weights, salt)
    return on_device(bits, weights, salt)


def _on_cpu(bits, weights: dict, salt: int) -> list:
    """numpy over the tensor's memory (no copy but the strided sample's), uint64 wrapping."""
    import numpy as np

    w = weights.get("cpu")
    if w is None:
        w = weights["cpu"] = np.random.default_rng(43).integers(
            0, 1 << 63, COLS, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    if bits.shape[0] * bits.shape[1] <= SMALL:  # the same sums in Python's integers, mod 2**64:
        # numpy's fixed cost per call (measured in a watched rank: ~50 us for 8 rows of 16
        # values, ~29 us this way) is the larger part for a small batch
        ws = weights.get("cpu-list") or weights.setdefault("cpu-list", w.tolist())
        return [((sum(a * b for a, b in zip(row, ws)) & _U64) >> 16) ^ salt for row in bits.tolist()]
    a = bits.numpy().astype(np.uint64)
    h = (a * w[:a.shape[1]]).sum(axis=1, dtype=np.uint64) >> np.uint64(16)
    return [v ^ salt for v in h.tolist()]


def on_device(bits, weights: dict, salt: int):
    """The same dot product in int64 on the tensor's device, left there (read at the run's end:
    no sync per step); its values differ from the CPU's, the same on every rank of one device
    type."""
    import torch

    w = weights.get(bits.device)
    if w is None:
        g = torch.Generator().manual_seed(43)
        w = weights[bits.device] = (torch.randint(0, 1 << 62, (COLS,), generator=g) * 2 + 1).to(bits.device)
    return ((bits.to(torch.int64) * w[:bits.shape[1]]).sum(1) >> 16 & 0xFFFFFFFFFFFF) ^ salt
