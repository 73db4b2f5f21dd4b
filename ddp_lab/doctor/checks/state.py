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
import weakref

from ..frames import first_of
from . import _state_modes as modes
from ._state_judge import judge as _judge_state
from ._state_backward import Backwards, GradientReads
from ._state_outside import built_lines
from ._state_rank import Rank, comparable, is_sharded
from .api import Check, digest, in_place_functions, written_by

MUTED_FROM = 16  # parameters: an optimizer of more steps with `seen` out of the core's table
FIRST, EVERY = 5, 10  # hash steps 0-4, then every 10th: a model's full hash is not free


IN_NO_MODEL = "(in no wrapped model)"  # a wrapped model exists: nothing reduces its gradients
BUILT = "state-built"  # {name: the line that built its module}, for IN_NO_MODEL parameters
NO_WRAPPER = "(no wrapper)"  # no wrapped model: compared where the ranks started equal


def due(step: int) -> bool:
    return step < FIRST or (step + 1) % EVERY == 0


def outside(ctx, models, optimizers, labels: dict) -> dict:
    """Parameters an optimizer steps that no wrapped model holds: with a wrapped model, a module
    left out of fully_shard or DDP, a learnable loss weight (nothing reduces their gradients);
    with none, the parameters of a script that keeps its replicas in step by hand (compared
    where they were equal on every rank when their optimizer first stepped: the judge). Named
    as the script's own modules name them (its frames' local nn.Modules), else by optimizer
    position; each name kept in `labels` (by id) so that it never changes during the run."""
    inside = {id(p) for _, w, _, _, _ in models for p in w.module.parameters()}
    found = [(f"optimizer{k} group {g} #{i} {tuple(p.shape)}", p) for k, opt in enumerate(optimizers)
             for g, group in enumerate(opt.param_groups) for i, p in enumerate(group["params"])
             if id(p) not in inside and not is_sharded(p)]
    if not found:
        return {}
    if any(id(p) not in labels for _, p in found):
        names = _script_names(ctx)
        suffix = IN_NO_MODEL if models else NO_WRAPPER
        new = [(fallback, p) for fallback, p in found if id(p) not in labels]
        for fallback, p in new:
            labels[id(p)] = (f"{names.get(id(p), fallback)} {suffix}", p)
        if models:  # a module left out of the wrapper: where the script built it
            built = built_lines(ctx, sys._getframe(1), {id(p) for _, p in new})
            if built:
                ctx.add(BUILT, {labels[i][0]: line for i, line in built.items()})
    return {labels[id(p)][0]: p for _, p in found}


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


def attach(ctx) -> None:
    import torch
    from torch.nn.modules.module import register_module_buffer_registration_hook

    rank = Rank(ctx)
    setter = torch.Tensor.data.__set__

    def seen(func, args, kwargs, result):
        if rank.in_optimizer:
            return
        frame = sys._getframe(1)
        for t in written_by(func, args, kwargs):
            rank.wrote(t, frame)
        if func == setter and len(args) > 1 and rank.lookup(args[0]) is not None:
            rank._remember(args[0], rank.lookup(args[0]))  # its new storage

    funcs = in_place_functions()
    table = getattr(ctx, "_functions", None)  # the core's {func: handlers}

    lists: list = []  # the core's handler lists of `funcs` (the same list objects for the run)
    muted = [False]  # `seen` is out of them now

    def mute(quiet: bool, many: bool = True) -> None:
        """Out of the core's table while an optimizer steps: a for-loop optimizer (CPU) makes
        a few in-place ops per parameter, each of which would reach `seen` only to be ignored.
        Not for an optimizer of a few parameters (`many` False): going through the lists (one
        per in-place function, ~180) then costs more than the few calls `seen` ignores."""
        rank.in_optimizer = quiet
        if not isinstance(table, dict) or quiet == muted[0] or (quiet and not many):
            return
        if not lists:
            lists.extend(table.setdefault(f, []) for f in funcs)
        for handlers in lists:
            if quiet == (seen in handlers):
                handlers.remove(seen) if quiet else handlers.append(seen)
        muted[0] = quiet

    def opt_begins(opt):
        mute(True, sum(len(g["params"]) for g in opt.param_groups) > MUTED_FROM)
        if rank.stepping(opt):  # its parameters as they start (the judge's replicas)
            _started(ctx, rank)

    def buffer_set(module, name, tensor):  # `self.ema = 0.9 * self.ema + ...` re-registers it
        found = rank.modules.get(id(module))
        if found is not None and tensor is not None and found[1] is module:
            entry = ("buffer", f"{found[0]}.{name}" if found[0] else name)
            rank.record(entry, sys._getframe(1))
            rank._remember(tensor, entry)

    guarded = ctx.guard(buffer_set)
    register_module_buffer_registration_hook(  # every module built anywhere registers: ids first
        lambda m, n, t: guarded(m, n, t) if id(m) in rank.modules else None)
    ctx.on_optimizer_step(before=opt_begins, after=lambda opt: mute(False))  # after the core's
    ctx.on_torch_function(funcs, seen)
    ctx.on_model(lambda c, w: (rank.refresh(), c.add("state-models", _model_row(w))))
    ctx.on_step_end(lambda c: _step_end(c, rank))
    backwards = Backwards(ctx)
    ctx.on_model(lambda c, w: backwards.model(w))
    ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward], backwards.backward)
    ctx.on_step_end(lambda c: backwards.step_end())
    reads = GradientReads(ctx, rank, due, digest, is_sharded)
    ctx.on_torch_function([torch._foreach_norm, torch.linalg.vector_norm, torch.norm, torch.Tensor.norm],
                          reads.read)
    ctx.on_step_end(lambda c: reads.step_end())
    ctx.on_finish(lambda c: _at_exit(c, rank))
    mode = modes.Modes(ctx)
    ctx.on_model(lambda c, w: mode.model(w))
    ctx.on_step_end(lambda c: mode.step_end())


def _model_row(w) -> dict:
    sync = getattr(w.wrapper, "forward_sync_buffers", getattr(w.wrapper, "broadcast_buffers", True))
    return {"kind": w.kind, "line": w.line, "sync_buffers": bool(sync) if w.kind == "ddp" else False}


def _step_end(ctx, rank) -> None:
    rank.in_optimizer = False
    if due(ctx.step):
        _hash(ctx, rank, {"step": ctx.step})
    rank.flush()


def _at_exit(ctx, rank) -> None:
    """The last step's state, hashed once when the script ends (the schedule thins out: a
    parting at step 6 of 8 is seen here); not after an exception or a hang (a step cut short)."""
    rank.flush()
    if ctx.step and not any(k in ctx.records for k in ("error", "hung")):
        _hash(ctx, rank, {"step": ctx.step - 1, "exit": True})


def _hash(ctx, rank, row) -> None:
    began = time.perf_counter()
    rank.refresh()
    models = comparable(ctx.models)
    row.update({"parameter": {}, "buffer": {}, "sharded": 0})
    for i, _, params, buffers, sharded in models:
        prefix = f"model{i}." if len(models) > 1 else ""
        row["parameter"].update({prefix + n: digest(p) for n, p in params.items()})
        row["buffer"].update({prefix + n: digest(b) for n, b in buffers.items()})
        row["sharded"] += sharded
    found = outside(ctx, models, rank.optimizers, rank.labels)
    if row.get("exit") and not rank.optimizers:  # the script freed them (main() returned): the
        found = dict(rank.labels.values())  # parameters they stepped, as labelled (held there)
    row["parameter"].update({n: digest(p) for n, p in found.items()})
    ctx.add("state", row)
    rank.cost += time.perf_counter() - began
    ctx.emit("state-cost", {"steps_hashed": len(ctx.records.get("state", [])), "seconds": rank.cost})


def _started(ctx, rank) -> None:
    """The parameters of the optimizer that steps for the first time, that no wrapped model
    holds, hashed before its first update: the judge compares those that start equal on every
    rank (replicas kept in step by hand), never those each rank starts with its own."""
    models = comparable(ctx.models)
    found = {n: digest(p) for n, p in outside(ctx, models, rank.optimizers, rank.labels).items()
             if n.endswith(NO_WRAPPER) and n not in rank.started}
    if found:
        rank.started.update(found)
        ctx.add("state-start", {"step": ctx.step, "parameter": found})


# --- the parent: _state_judge.py, _state_modes.py ----------------------------------------------


def judge(ev):
    return _judge_state(ev) + modes.judge(ev)


CHECK = Check(
    name="state",
    mechanism="parameters and buffers identical across ranks after each optimizer step; every "
              "rank's training forward in the same mode (train/eval)",
    lesson="01",
    codes={"parameters-differ-after-step": "error", "buffers-differ-after-step": "warning",
           "state-not-compared": "info", "ranks-train-in-different-modes": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests=("tests/doctor/checks/test_state.py", "tests/doctor/checks/test_state_modes.py"),
    notes=("hashes steps 0-4, then every 10th step, and the last step when the script ends (a full "
           "hash of a large model is not free): a parting between two hashes is dated by the later one",
           "with no wrapped model, the optimizers' parameters are compared where every rank started "
           "with the same values (a script that syncs gradients by hand); each rank's own model is not",
           "FSDP2: sharded parameters hold a different shard per rank by design and are not compared",
           "DDP with its buffer sync on: buffers are overwritten by rank 0's before each forward, not compared",
           "modes: the mode of the training forward through the DDP wrapper or FSDP2 root (autograd on); "
           "the line named is the last train()/eval() on the model itself, not on a submodule"))
