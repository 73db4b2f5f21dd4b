"""`ddp-lab watch train.py [args]`, the parent's side: the user's script, unchanged, on real
ranks (ddp_lab.launch) with every registered check (ddp_lab/doctor/checks) attached.

Each rank runs core.script_rank: the core's hooks and the checks' `attach(ctx)`, then the
script as `__main__` with the environment torchrun gives (RANK, WORLD_SIZE, MASTER_ADDR/PORT on
the launcher's store; the script calls its own init_process_group). Each rank writes its
records to a file as it goes (a rank that hangs or is killed still told what it saw); the
parent reads them, with the launch's flight record and stacks, into one `Evidence` that every
check judges. Inside a torchrun job: torchrun.py.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time

from ...launching.launcher import launch
from ..checks import judge_all
from ..checks.api import Evidence
from ..checks.context import read_records
from ..errors import DoctorBug
from ..report import BY_LINE, Report, dedupe
from . import reference_run as ref_run
from .core import script_rank

DEFAULT_TIMEOUT = 60.0


class WatchScriptError(ValueError):
    """The script cannot be watched (missing, fails to start, never starts a process group):
    the message says why; `output` holds what the script printed (its traceback)."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output


def validate_script(path: str, nproc, timeout) -> str:
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise WatchScriptError(f"--nproc-per-node must be an integer >= 1, got {nproc!r}")
    if not isinstance(timeout, (int, float)) or timeout < 3:
        raise WatchScriptError(f"--timeout must be at least 3 seconds, got {timeout!r}")
    if not os.path.exists(path):
        raise WatchScriptError(f"no such script: {path}")
    if not os.path.isfile(path):
        raise WatchScriptError(f"not a file: {path} (give the training script, e.g. train.py)")
    if not path.endswith(".py"):
        raise WatchScriptError(f"{path} is not a Python file (.py): watch runs a training script")
    return os.path.abspath(path)


class _Progress:
    """A line on stderr while the ranks run: the step each rank has reached."""

    def __init__(self, folder: str, nproc: int, name: str, stream):
        self.folder, self.nproc, self.name, self.stream = folder, nproc, name, stream
        self.stop = threading.Event()
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _steps(self) -> list[int]:
        out = []
        for r in range(self.nproc):
            try:
                with open(os.path.join(self.folder, f"rank{r}.jsonl"), "rb") as f:
                    out.append(f.read().count(b'"end":'))
            except OSError:
                out.append(0)
        return out

    def _loop(self) -> None:
        last, shown = None, time.time()  # a run of a few seconds prints nothing
        while not self.stop.wait(0.5):
            steps = self._steps()
            now = time.time()
            if steps != last and now - shown > (1 if self.tty else 10):
                text = f"watch {self.name}: steps done per rank {steps}"
                self.stream.write(("\r" + text) if self.tty else text + "\n")
                self.stream.flush()
                last, shown = steps, now
        if self.tty and last is not None:
            self.stream.write("\n")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(2)


def watch_script(path: str, args=(), nproc: int = 2, timeout: float = DEFAULT_TIMEOUT,
                 checks=None, progress=None, reference=None, global_batch=None):
    """Run `path` (a training script, as `torchrun --nproc-per-node nproc path args` would) on
    real ranks with every watch check attached; the `Report`. Raises WatchScriptError when the
    script cannot be watched. `checks`: names of the checks to attach (default: all).
    `reference`: K (or True: 3) to compare the first K steps with one process's on the same
    global batch (watch/reference_run.py: one more launch, at world size 1); `global_batch`: with
    it, the samples per step the job means (a step that trains on another number is a warning)."""
    script = validate_script(path, nproc, timeout)
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
        start = time.time()
        with (_Progress(folder, nproc, os.path.basename(path), progress) if progress
              else contextlib.nullcontext()):
            run = launch(script_rank, script, list(args), folder, checks, world_size=nproc,
                         timeout=timeout, init_process_group=False, grace=2.0, env=env,
                         label=f"watch {os.path.basename(path)}")
        seconds = time.time() - start
        ranks = [read_records(os.path.join(folder, f"rank{r}.jsonl")) for r in range(nproc)]
        _refuse_unstarted(run, ranks, path)
        ev = Evidence(ranks, run=run, script=script, world_size=nproc, args=tuple(args))
        if steps:
            job = ref_run.Reference(script, tuple(args), nproc, timeout, steps, compared, global_batch)
            ev.reference = ref_run.run_reference(job, ranks, seconds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = build_report(ev, checks)
    if steps:
        report.notes += ref_run.notes(ev)
    return report


def _output(run, ranks=()) -> str:
    """The failing rank's traceback from the user's first frame (watch's and runpy's folded
    away), else what it wrote to stderr."""
    root = run.root_cause or (run.ranks[0] if run.ranks else None)
    if root is None:
        return ""
    err = (ranks[root.rank].get("error") or {}) if root.rank < len(ranks) else {}
    text = err.get("traceback") or (root.stderr or "").strip() or (
        root.error.traceback if root.error else "")
    return f"rank {root.rank}:\n{text.rstrip()}"[-4000:]


def _refuse_unstarted(run, ranks: list[dict], path: str) -> None:
    """A script that never got going is bad input, not a finding: it fails before it starts a
    process group (a syntax error, an import error, its own argument parser), or it ends
    without ever starting one."""
    started = any(r.get("group") for r in ranks)
    if started:
        return
    name = os.path.basename(path)
    failed = [r for r in run.ranks if not r.ok]
    if failed and not any(r.get("started") for r in ranks):
        raise DoctorBug(f"watch's own set-up failed on a rank before {name} started; please "
                        f"report it with this output:\n{_output(run)}")
    if failed:
        rec = next((r for r in ranks if r.get("error") or r.get("exit")), {})
        err = rec.get("error") or {}
        if err:
            why = f"{name} failed before it started a process group: {err['type']}: {err['message'][:300]}"
        elif rec.get("exit"):
            why = f"{name} exited with status {rec['exit']} before it started a process group"
        else:
            why = f"{name} failed before it started a process group ({run.status})"
        raise WatchScriptError(why, _output(run, ranks))
    raise WatchScriptError(
        f"{name} never called torch.distributed.init_process_group: watch checks a distributed "
        "training script, run as torchrun runs it (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
        "are set for it)")


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
