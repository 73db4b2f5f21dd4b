"""Parameters and buffers identical across ranks after the optimizer's step.

On each rank, after the steps `due` picks, a hash of every parameter and buffer of each model the
script wrapped; the parent compares them. What is compared:
- DDP: every parameter (all-reduced gradients and the same optimizer keep the replicas equal;
  DDP broadcasts rank 0's state only in its constructor, torch/nn/parallel/distributed.py:1066),
  except those set aside with `parameters_to_ignore`; buffers only when DDP does not broadcast
  them before each forward (`broadcast_buffers=False` / `forward_sync_buffers=False`:
  distributed.py:1781 and 2375 `_check_sync_bufs_pre_fwd`); with the sync on, the buffers
  differ after a step by design and the next forward overwrites them with rank 0's.
- FSDP2: the parameters that are not sharded (plain tensors; DTensors with Replicate placements
  only) and every buffer (fully_shard never syncs buffers). A sharded DTensor holds a different
  shard on each rank by design: not compared.
Where it differs, the line at fault: an edit of a parameter outside the optimizer's step made
on some ranks only (a TorchFunctionMode sees in-place ops, `.data =`, nn.init, load_state_dict's
copy_), or the change after the wrap that `wrapped` recorded; for a buffer, the line that wrote
it (in-place ops, F.batch_norm's running stats) or the DDP(...) that turned the sync off.
"""
from __future__ import annotations

import sys
import time

from ..frames import first_of
from ._state_judge import judge
from .api import Check, digest

FIRST, EVERY = 5, 10  # hash steps 0-4, then every 10th: a model's full hash is not free
NOT_EDITS = {"requires_grad_", "share_memory_", "retain_grad_", "record_stream_"}


def due(step: int) -> bool:
    return step < FIRST or (step + 1) % EVERY == 0


def _sharded(p) -> bool:
    placements = getattr(p, "placements", None)
    return placements is not None and any(not pl.is_replicate() for pl in placements)


def comparable(watched) -> list[tuple]:
    """(model index, watched, {name: param}, {name: buffer}, sharded count) per DDP or FSDP2
    model, each plain module once."""
    out, seen = [], set()
    for i, w in enumerate(m for m in watched if m.kind in ("ddp", "fsdp2")):
        if id(w.module) in seen:
            continue
        seen.add(id(w.module))
        if w.kind == "ddp":
            ignore = set(getattr(w.wrapper, "parameters_to_ignore", ()) or ())
            params = {n: p for n, p in w.module.named_parameters() if n not in ignore}
            sync = getattr(w.wrapper, "forward_sync_buffers", getattr(w.wrapper, "broadcast_buffers", True))
            buffers = {} if sync else {n: b for n, b in w.module.named_buffers() if n not in ignore}
            out.append((i, w, params, buffers, 0))
        else:
            named = list(w.module.named_parameters())
            params = {n: p for n, p in named if not _sharded(p)}
            out.append((i, w, params, dict(w.module.named_buffers()), len(named) - len(params)))
    return out


def outside(ctx, models, optimizers) -> dict:
    """Parameters an optimizer steps that no wrapped model holds (a module left out of
    fully_shard or DDP, a learnable loss weight): nothing reduces their gradients. Named as the
    script's own modules name them (its frames' local nn.Modules), else by optimizer position."""
    if not models:
        return {}
    inside = {id(p) for _, w, _, _, _ in models for p in w.module.parameters()}
    found = [(f"optimizer{k} group {g} #{i} {tuple(p.shape)}", p) for k, opt in enumerate(optimizers)
             for g, group in enumerate(opt.param_groups) for i, p in enumerate(group["params"])
             if id(p) not in inside and not _sharded(p)]
    if not found:
        return {}
    names = _script_names(ctx)
    return {f"{names.get(id(p), fallback)} (in no wrapped model)": p for fallback, p in found}


def _script_names(ctx) -> dict:
    import torch

    names, frame = {}, sys._getframe(1)
    while frame is not None:
        if ctx.is_user_file(frame.f_code.co_filename):
            for value in list(frame.f_locals.values()):
                if isinstance(value, torch.nn.Module):
                    for n, p in value.named_parameters():
                        names.setdefault(id(p), n)
        frame = frame.f_back
    return names


class _Rank:
    """What one rank keeps: the watched tensors by id and storage, the edits made to them
    outside the optimizer (per user line), and whether an optimizer is stepping."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.in_optimizer = False
        self.ids: dict[int, tuple] = {}
        self.ptrs: dict[int, tuple] = {}
        self.edits: dict[str, dict] = {}
        self.dirty = False
        self.cost = 0.0  # seconds spent hashing (the README's cost figure)
        self.optimizers: list = []
        self.modules: dict[int, tuple] = {}  # id -> (qualified name, the module, kept)
        self.buffers_named: set = set()

    def refresh(self) -> None:
        self.ids.clear()
        self.ptrs.clear()
        models = comparable(self.ctx.models)
        for i, w, _, _, _ in models:
            prefix = f"model{i}." if len(models) > 1 else ""
            self.modules.update({id(m): (prefix + n, m) for n, m in w.module.named_modules()})
            for kind, named in (("parameter", w.module.named_parameters()),
                                ("buffer", w.module.named_buffers())):
                for n, t in named:
                    self._remember(t, (kind, prefix + n))

    def _remember(self, t, entry) -> None:
        self.ids[id(t)] = (entry, t)  # the tensor kept: its id is not reused while we look
        if not hasattr(t, "_local_tensor"):
            try:
                ptr = t.data_ptr()
            except (RuntimeError, AttributeError):
                return
            if ptr:
                self.ptrs[ptr] = (entry, t)

    def lookup(self, t):
        """The (kind, name) of a watched tensor: `t` itself, or a view of its storage (`.data`)
        while the tensor still lives there."""
        found = self.ids.get(id(t))
        if found is not None and found[1] is t:
            return found[0]
        if hasattr(t, "_local_tensor") or not hasattr(t, "data_ptr"):
            return None
        try:
            ptr = t.data_ptr()
            found = self.ptrs.get(ptr)
            return found[0] if found is not None and found[1].data_ptr() == ptr else None
        except RuntimeError:
            return None

    def wrote(self, t, frame) -> None:
        entry = self.lookup(t)
        if entry is not None and not self.in_optimizer:
            self.record(entry, frame)

    def record(self, entry, frame) -> None:
        if entry in self.buffers_named:
            return  # a buffer's writer is named once (BatchNorm writes its stats every forward)
        if first_of(frame, self.ctx.is_user_file) == "theirs":
            return  # DDP's or FSDP's own copies, the optimizer's update
        line = self.ctx.user_line(frame)
        if not line:
            return
        kind, name = entry
        e = self.edits.setdefault(f"{kind} {line}", {"kind": kind, "line": line, "names": [],
                                                      "step": self.ctx.step, "count": 0})
        e["count"] += 1
        if name not in e["names"] and len(e["names"]) < 20:
            e["names"].append(name)
        if kind == "buffer":
            self.buffers_named.add(entry)
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            self.ctx.emit("state-edits", list(self.edits.values()))
            self.dirty = False


def _targets(func, args, kwargs):
    import torch.nn.functional as F

    if func is F.batch_norm:
        training = args[5] if len(args) > 5 else kwargs.get("training", False)
        return [t for t in (args[1:3] if len(args) > 2 else ()) if t is not None] if training else []
    first = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
    return [first] if first is not None else []


def _edit_functions():
    import torch

    names = [n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("_")
             and n not in NOT_EDITS]
    names += ["__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__"]
    funcs = [getattr(torch.Tensor, n) for n in names if hasattr(torch.Tensor, n)]
    funcs += [getattr(torch.nn.init, n) for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    funcs += [torch.Tensor.data.__set__, torch.nn.functional.batch_norm]
    return funcs


def attach(ctx) -> None:
    import torch
    from torch.nn.modules.module import register_module_buffer_registration_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    rank = _Rank(ctx)
    setter = torch.Tensor.data.__set__

    def seen(func, args, kwargs, result):
        if rank.in_optimizer:
            return
        frame = sys._getframe(1)
        for t in _targets(func, args, kwargs):
            rank.wrote(t, frame)
        if func == setter and len(args) > 1 and rank.lookup(args[0]) is not None:
            rank._remember(args[0], rank.lookup(args[0]))  # its new storage

    funcs = _edit_functions()
    table = getattr(ctx, "_functions", None)  # the core's {func: handlers}

    def mute(quiet: bool) -> None:
        """Out of the core's table while an optimizer steps: a for-loop optimizer (CPU) makes
        a few in-place ops per parameter, each of which would reach `seen` only to be ignored."""
        rank.in_optimizer = quiet
        for f in funcs if isinstance(table, dict) else ():
            handlers = table.get(f)
            if handlers is not None and quiet == (seen in handlers):
                handlers.remove(seen) if quiet else handlers.append(seen)

    def opt_begins(opt, args, kwargs):
        mute(True)
        if not any(o is opt for o in rank.optimizers):
            rank.optimizers.append(opt)

    def buffer_set(module, name, tensor):  # `self.ema = 0.9 * self.ema + ...` re-registers it
        found = rank.modules.get(id(module))
        if found is not None and tensor is not None and found[1] is module:
            entry = ("buffer", f"{found[0]}.{name}" if found[0] else name)
            rank.record(entry, sys._getframe(1))
            rank._remember(tensor, entry)

    guarded = ctx.guard(buffer_set)
    register_module_buffer_registration_hook(  # every module built anywhere registers: ids first
        lambda m, n, t: guarded(m, n, t) if id(m) in rank.modules else None)
    register_optimizer_step_pre_hook(ctx.guard(opt_begins))  # never raises into the script
    register_optimizer_step_post_hook(ctx.guard(lambda opt, args, kwargs: mute(False)))  # after the core's
    ctx.on_torch_function(funcs, seen)
    ctx.on_model(lambda c, w: (rank.refresh(), c.add("state-models", _model_row(w))))
    ctx.on_step_end(lambda c: _step_end(c, rank))
    ctx.on_finish(lambda c: rank.flush())


def _model_row(w) -> dict:
    sync = getattr(w.wrapper, "forward_sync_buffers", getattr(w.wrapper, "broadcast_buffers", True))
    return {"kind": w.kind, "line": w.line, "sync_buffers": bool(sync) if w.kind == "ddp" else False}


def _step_end(ctx, rank) -> None:
    rank.in_optimizer = False
    step = ctx.step
    if due(step):
        began = time.perf_counter()
        rank.refresh()
        models = comparable(ctx.models)
        row = {"step": step, "parameter": {}, "buffer": {}, "sharded": 0}
        for i, _, params, buffers, sharded in models:
            prefix = f"model{i}." if len(models) > 1 else ""
            row["parameter"].update({prefix + n: digest(p) for n, p in params.items()})
            row["buffer"].update({prefix + n: digest(b) for n, b in buffers.items()})
            row["sharded"] += sharded
        row["parameter"].update({n: digest(p) for n, p in outside(ctx, models, rank.optimizers).items()})
        ctx.add("state", row)
        rank.cost += time.perf_counter() - began
        ctx.emit("state-cost", {"steps_hashed": len(ctx.records.get("state", [])), "seconds": rank.cost})
    rank.flush()


# --- the parent: _state_judge.py ---------------------------------------------------------------


CHECK = Check(
    name="state",
    mechanism="parameters and buffers identical across ranks after each optimizer step",
    lesson="01",
    codes={"parameters-differ-after-step": "error", "buffers-differ-after-step": "warning",
           "state-not-compared": "info"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_state.py",
    notes=("hashes steps 0-4, then every 10th step (a full hash of a large model is not free)",
           "FSDP2: sharded parameters hold a different shard per rank by design and are not compared",
           "DDP with its buffer sync on: buffers are overwritten by rank 0's before each forward, not compared"))
