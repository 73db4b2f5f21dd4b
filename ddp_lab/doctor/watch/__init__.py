"""`ddp_lab.watch`: your own training step on real ranks, checked after every step.

    report = ddp_lab.watch(train_step, make_model, batches, strategy="ddp")

`train_step(model, batch, step)` (optionally `optimizer=`) is yours: it gets the model wrapped
as the strategy wraps it (DDP, FSDP2's fully_shard, a DeepSpeed ZeRO-3 engine) and returns what
it would log. `watch` runs it on `world_size` real ranks (ddp_lab.launch) for `steps` steps and
checks, across ranks: parameters and buffers identical after each step; dropout masks that
differ (and, under FSDP2, initial weights that agree); the same collectives in the same order
(the flight recorder); no read of a sharded parameter outside forward; a checkpoint your `save`
writes that reloads into the plain module; a returned loss equal to its value over all ranks'
data. A `Report` of `Finding`s, like the doctor's.
"""
from __future__ import annotations

import inspect
import os
import tempfile
from typing import Callable

from ...instruments.deepspeed_ops import require_built
from ...launching.cuda_init import gpu_count
from ...launching.launcher import launch
from ..checks.api import Evidence
from ..checks.context import read_records
from ..report import Report
from ..sync import records
from ..userline import code_files, restore_where
from . import function_checks
from .rank import StepRun, WatchInputError, body, returned_line
from .script import build_report, watch_script

__all__ = ["watch", "WatchInputError"]
STRATEGIES = ("ddp", "fsdp2", "zero3")


def watch(train_step, model: Callable | None = None, batches=None, *, strategy: str = "ddp",
          steps: int = 3, world_size: int = 2, save: Callable | None = None,
          evaluate: Callable | None = None, optimizer: Callable | None = None,
          timeout: float = 60, args=(), reference=None, global_batch=None) -> Report:
    """Run `train_step(model, batch, step)` on real ranks and check what it does across them;
    or, given a script's path (`watch("train.py", args=["--epochs", "1"])`), run the script
    unchanged on `world_size` ranks as torchrun would, with every check attached
    (script.watch_script; the other arguments are the function API's); `reference=K` (or True:
    3) also runs it at world size 1 on the same global batch for K steps and compares
    (`ddp-lab watch --reference`, watch/reference_run.py); with it, `global_batch=G` declares
    the samples per step the job means.

    `model` is a zero-argument factory (or an nn.Module class) called on every rank;
    `batches(rank, step)` gives each rank's batch (a tensor, a tuple or a dict); `save(model,
    path)` your checkpoint code, called after the steps on every rank; `evaluate(model, batch)`
    your evaluation, called after them on every rank with its next batch, returning what you log
    (its values must agree across ranks: a metric of one rank's data does not); `optimizer(params)`
    builds the optimizer passed as `optimizer=` when train_step takes one (default SGD, lr
    0.05; under ZeRO-3 the engine's). Raises WatchInputError (a ValueError) when they do not fit.
    """
    if isinstance(train_step, (str, os.PathLike)):
        return watch_script(os.fspath(train_step), args, nproc=world_size, timeout=timeout,
                            reference=reference, global_batch=global_batch)
    if reference not in (None, False) or global_batch is not None:
        raise WatchInputError("reference= and global_batch= serve a script (watch('train.py', ...)): "
                              "the function API has no one-process run of its own to compare with")
    _validate(train_step, model, batches, strategy, steps, world_size, save)
    if strategy == "zero3" and gpu_count() == 0:
        require_built()  # DeepSpeed's op: this environment's error (OpBuildError), never a finding
    if evaluate is not None:
        _fits(evaluate, "evaluate", ("model", "batch"))
    wants = "optimizer" in inspect.signature(train_step).parameters
    with tempfile.TemporaryDirectory(prefix="ddp-lab-watch-") as folder:
        records = os.path.join(folder, "rank{}.jsonl")
        job = StepRun(train_step, model, batches, strategy, steps, save=save, evaluate=evaluate,
                      optimizer=optimizer, wants_optimizer=wants,
                      checkpoint=os.path.join(folder, "checkpoint.pt"), records=records,
                      returned_at=returned_line(train_step))
        run = launch(body, job, world_size=world_size, timeout=timeout, grace=2.0,
                     label=f"watch {strategy}")
        ranks = [read_records(records.format(r)) for r in range(world_size)]
    return _report(run, ranks, train_step, strategy, steps, world_size)


def _validate(train_step, model, batches, strategy, steps, world_size, save) -> None:
    if strategy not in STRATEGIES:
        raise WatchInputError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    for name, fn in (("train_step", train_step), ("model", model), ("batches", batches)):
        if not callable(fn):
            raise WatchInputError(f"{name} must be callable, got {type(fn).__name__}")
    _fits(train_step, "train_step", ("model", "batch", "step"), optional=("optimizer",))
    _fits(batches, "batches", ("rank", "step"))
    if save is not None:
        _fits(save, "save", ("model", "path"))
    if not isinstance(steps, int) or steps < 1 or not isinstance(world_size, int) or world_size < 2:
        raise WatchInputError(f"steps must be >= 1 and world_size >= 2, got {steps!r}, {world_size!r}")


def _fits(fn, name: str, args: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*args, **{k: None for k in optional if k in sig.parameters})
    except TypeError as exc:
        raise WatchInputError(f"{name} must take ({', '.join(args)}); {getattr(fn, '__name__', name)}"
                              f"{sig} does not ({exc})") from None


def _report(run, ranks, train_step, strategy, steps, world_size) -> Report:
    """The registry's checks (ddp_lab/doctor/checks, as for a script) and the function API's
    own: random draws, sharded reads, the evaluation, ZeRO-3's reload."""
    recs = [records(r.stdout) for r in run.ranks]
    _raise_input_error(run)
    code = getattr(train_step, "__code__", None)
    ev = Evidence(ranks, run=run, script=code.co_filename if code else "train_step",
                  world_size=world_size)
    shared = build_report(ev)
    own = function_checks
    found = (shared.findings + own.random_findings(recs, strategy)
             + own.read_findings(recs, strategy) + own.evaluate_findings(recs)
             + (own.reload_findings(recs[0] if recs else {}) if strategy == "zero3" else []))
    seconds = [v["seconds"] for v in (r.value for r in run.ranks if r.ok) if v]
    name = getattr(train_step, "__qualname__", "train_step")
    notes = [f"{steps} step(s) of your {name} on {world_size} ranks under {strategy}"]
    notes += [n for n in shared.notes[1:]]  # the shared checks' own notes (a check that failed)
    _name_lines(found, train_step)
    report = Report(name, world_size, steps, None, found, status=run.status, run=run,
                    notes=notes, strategy=strategy, tool="watch")
    report.seconds_per_step = _per_step(seconds)
    report.evidence = ev
    return report


def _name_lines(found, train_step) -> None:
    """Code that travelled to the ranks by value is named by its file and line again (this
    process still has the functions: the notebook's cells, the loaded file)."""
    files = code_files(train_step)
    for f in found:
        f.where = restore_where(f.where, files)
        f.evidence = [restore_where(e, files) for e in f.evidence]


def _per_step(seconds) -> dict:
    """{"step": s, "checks": s}: the mean over ranks and steps (steps after the first)."""
    rows = [row for per_rank in seconds for row in (per_rank[1:] or per_rank)]
    if not rows:
        return {}
    return {"step": sum(r[0] for r in rows) / len(rows), "checks": sum(r[1] for r in rows) / len(rows)}


def _raise_input_error(run) -> None:
    root = run.root_cause
    if root is not None and root.error is not None and root.error.type == WatchInputError.__name__:
        raise WatchInputError(f"rank {root.rank}: {root.error.message}")
