"""`ddp-lab watch train.py [args]`, the parent's side: the user's script, unchanged, on real
ranks (ddp_lab.launch) with every registered check (ddp_lab/doctor/checks) attached.

Each rank runs core.script_rank: the core's hooks and the checks' `attach(ctx)`, then the
script as `__main__`, launched as torchrun starts a worker (`launch(..., as_torchrun=True)`:
torchrun's variables on the launcher's store, fresh seeds, `python -u` streams; the script calls
its own init_process_group); its output is passed on as it runs (`output`, console.py), and
`--timeout` is per step (steps.py). Each rank writes its
records to a file as it goes (a rank that hangs or is killed still told what it saw); the
parent reads them, with the launch's flight record and stacks, into one `Evidence` that every
check judges. Inside a torchrun job: torchrun.py.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

from ...launching.launcher import launch
from ..checks import judge_all
from ..checks.api import Evidence
from ..checks.context import read_records
from ..errors import DoctorBug
from ..report import BY_LINE, Report, dedupe
from . import reference_run as ref_run
from .console import Console, Progress
from .core import script_rank
from .steps import first_step_allowance

DEFAULT_TIMEOUT = 60.0  # seconds a step may take (the first step: steps.first_step_allowance)


class WatchScriptError(ValueError):
    """The script cannot be watched (missing, fails to start, never starts a process group):
    the message says why; `output` holds what the script printed (its traceback)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def validate_script(path: str, nproc, timeout, first_step_timeout=None) -> str:
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise WatchScriptError(f"--nproc-per-node must be an integer >= 1, got {nproc!r}")
    if not isinstance(timeout, (int, float)) or timeout < 3:
        raise WatchScriptError(f"--timeout must be at least 3 seconds, got {timeout!r}")
    if first_step_timeout is not None and (not isinstance(first_step_timeout, (int, float))
                                           or first_step_timeout < 3):
        raise WatchScriptError(f"--first-step-timeout must be at least 3 seconds, got "
                               f"{first_step_timeout!r}")
    if not os.path.exists(path):
        raise WatchScriptError(f"no such script: {path}")
    if not os.path.isfile(path):
        raise WatchScriptError(f"not a file: {path} (give the training script, e.g. train.py)")
    if not path.endswith(".py"):
        raise WatchScriptError(f"{path} is not a Python file (.py): watch runs a training script")
    return os.path.abspath(path)


def watch_script(path: str, args=(), nproc: int = 2, timeout: float = DEFAULT_TIMEOUT,
                 checks=None, progress=None, first_step_timeout: float | None = None,
                 output=None, reference=None, global_batch=None):
    """Run `path` (a training script, as `torchrun --nproc-per-node nproc path args` would) on
    real ranks with every watch check attached; the `Report`. Raises WatchScriptError when the
    script cannot be watched. `checks`: names of the checks to attach (default: all).
    `timeout`: the seconds a step may take; `first_step_timeout` the first step's (default:
    steps.first_step_allowance). `output(rank, stream, line)`: called with each line the
    script writes, as it writes it (the CLI's console.py); `progress`: a stream for the steps
    done per rank (or the CLI's Console, which shows both). `reference`: K (or True: 3) to
    compare the first K steps with one process's on the same global batch
    (watch/reference_run.py: one more launch, at world size 1); `global_batch`: with it, the
    samples per step the job means (a step that trains on another number is a warning)."""
    start = time.time()
    script = validate_script(path, nproc, timeout, first_step_timeout)
    first = first_step_allowance(timeout, first_step_timeout)
    steps = None
    if global_batch is not None and reference in (None, False):
        reference = True  # a declared global batch is judged by the reference check
    if reference is not None and reference is not False:
        try:
            steps = ref_run.validate_steps(reference)
            global_batch = ref_run.validate_global_batch(global_batch)
        except ValueError as exc:
            raise WatchScriptError(str(exc)) from None
    folder = tempfile.mkdtemp(prefix="ddp-lab-watch-")
    compared = os.path.join(folder, "reference")
    env = {}
    if steps:
        os.mkdir(compared)
        env = ref_run.env("watched", compared, steps, nproc)
        checks = None if checks is None else sorted({*checks, "logged", "reference"})
    try:
        if progress is not None and not isinstance(progress, Console):
            progress = Console(progress, progress)  # a stream: the progress line alone
        launched = time.time()
        with (Progress(folder, nproc, os.path.basename(path), progress) if progress
              else contextlib.nullcontext()):
            run = launch(script_rank, script, list(args), folder, checks, str(path),
                         (float(timeout), first), world_size=nproc, timeout=first,
                         init_process_group=False, grace=2.0, as_torchrun=True, output=output,
                         env=env,
                         label=f"watch {'--reference ' if steps else ''}{os.path.basename(path)}")
        seconds = time.time() - launched
        ranks = [read_records(os.path.join(folder, f"rank{r}.jsonl")) for r in range(nproc)]
        refuse_unstarted(run, ranks, path)
        ev = Evidence(ranks, run=run, script=script, world_size=nproc, args=tuple(args))
        if steps:
            job = ref_run.Reference(script, tuple(args), nproc, timeout, steps, compared,
                                    global_batch, str(path), first)
            ev.reference = ref_run.run_reference(job, ranks, seconds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = build_report(ev, checks)
    report.seconds = time.time() - start
    if steps:
        report.notes += ref_run.notes(ev)
    return report


def _output(run, ranks=()) -> str:
    """The failing rank's traceback from the user's first frame (watch's and runpy's folded
    away), else what it wrote to stderr. `run` is None under torchrun."""
    if run is None:
        bad = next((r for r, rec in enumerate(ranks) if rec.get("error")), None)
        text = ranks[bad]["error"].get("traceback", "") if bad is not None else ""
        return f"rank {bad}:\n{text.rstrip()}"[-4000:] if text else ""
    root = run.root_cause or (run.ranks[0] if run.ranks else None)
    if root is None:
        return ""
    err = (ranks[root.rank].get("error") or {}) if root.rank < len(ranks) else {}
    text = err.get("traceback") or (root.stderr or "").strip() or (
        root.error.traceback if root.error else "")
    return f"rank {root.rank}:\n{text.rstrip()}"[-4000:]


STARTS = ("init_process_group", "init_device_mesh", "DeviceMesh(...)",
          "fully_shard without a mesh")  # every way torch 2.13 starts the default group


def refuse_unstarted(run, ranks: list[dict], path: str) -> None:
    """A script that never got going is bad input, not a finding: it fails before it starts a
    process group (a syntax error, an import error, its own argument parser), or it ends
    without ever starting one. `run` is None under torchrun."""
    started = any(r.get("group") for r in ranks)
    if started:
        return
    name = os.path.basename(path)
    if run is not None:
        failed, status = [r for r in run.ranks if not r.ok], run.status
    else:
        failed = [r for r in ranks if r.get("error") or r.get("exit") or r.get("hung")]
        status = "timeout" if any(r.get("hung") for r in ranks) else "error"
    if failed and not any(r.get("started") for r in ranks):
        raise DoctorBug(f"watch's own set-up failed on a rank before {name} started; please "
                        f"report it with this output:\n{_output(run, ranks)}")
    if failed:
        rec = next((r for r in ranks if r.get("error") or r.get("exit")), {})
        err = rec.get("error") or {}
        if err:
            why = f"{name} failed before it started a process group: {err['type']}: {err['message'][:300]}"
        elif rec.get("exit"):
            why = f"{name} exited with status {rec['exit']} before it started a process group"
        elif status == "timeout":
            hooks = next((r.get("step-hooks") for r in ranks if r.get("step-hooks")), None) or {}
            first = hooks.get("first") or (run.timeout if run is not None else None)
            why = (f"{name} did not start a process group within the first step's allowance"
                   + (f" ({first:g} s)" if first else "") + ": it hung, or its set-up needs "
                   "longer (--first-step-timeout)")
        else:
            why = f"{name} failed before it started a process group ({status})"
        raise WatchScriptError(why, _output(run, ranks))
    raise WatchScriptError(
        f"{name} never started a process group ({', '.join(STARTS)}): watch checks a "
        "distributed training script, run as torchrun runs it (RANK, WORLD_SIZE, MASTER_ADDR "
        "and MASTER_PORT are set for it)")


def build_report(ev: Evidence, checks=None) -> Report:
    """Every watch check (or those named in `checks`) judged on `ev`, in one Report."""
    found, notes = judge_all("watch", ev, checks)
    errors = sorted({e for r in ev.ranks for e in r.get("check-errors", [])})
    notes += [f"a check's hook failed on a rank: {e}" for e in errors[:5]]
    steps = len([s for s in ev.steps(0) if s.get("end")])
    kinds = [m["kind"] for m in ev.ranks[0].get("models", [])] if ev.ranks else []
    models = ", ".join(dict.fromkeys(f"{m['kind']}({m['type']})" for m in
                                     (ev.ranks[0].get("models", []) if ev.ranks else [])))
    notes.insert(0, f"{os.path.basename(ev.script)} ran unchanged on {ev.world_size} ranks: "
                    f"{steps} optimizer step(s) on rank 0" + (f"; models: {models}" if models else
                                                            "; no DDP, FSDP2 or compiled model seen"))
    status = ev.run.status if ev.run is not None else (
        "timeout" if any(r.get("hung") for r in ev.ranks) else
        "error" if any(r.get("exit") for r in ev.ranks) else "ok")
    strategy = "fsdp2" if "fsdp2" in kinds else "ddp"
    report = Report(os.path.basename(ev.script), ev.world_size, steps, None, dedupe(found, BY_LINE),
                    status=status, run=ev.run, notes=notes, strategy=strategy, tool="watch")
    codes = [r.get("exit") for r in ev.ranks if isinstance(r.get("exit"), int)]
    report.script_status = next((c for c in codes if c), 0)
    report.evidence = ev  # what the checks judged (tests and notebooks read it)
    return report


def exit_status(report) -> int:
    """The CLI's: the script's own non-zero status, else 1 with an error-level finding, else 0."""
    return getattr(report, "script_status", 0) or report.exit_status


def report_dict(report) -> dict:
    """The report as JSON data, with the CLI's exit status (the script's own non-zero status,
    else 1 with an error-level finding) and the script's own status."""
    data = report.to_dict()
    data["exit_status"] = exit_status(report)
    data["script_status"] = getattr(report, "script_status", 0)
    return data


def error_dict(exc: Exception, status: int = 2) -> dict:
    """A run that gave no report (bad input: exit 2; watch's own failure: 3) as JSON data."""
    return {"error": str(exc), "exit_status": status, "output": getattr(exc, "output", "")}
