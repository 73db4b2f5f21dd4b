"""watch inside a torchrun job (`torchrun ... -m ddp_lab.watch train.py`, `torchrun_main`):
there is no launcher; each rank runs the script as core.py runs it, then hands its records to
the job's own store (a client of torchrun's store, never a collective in the training group);
rank 0 judges and prints the report. A rank whose step has not ended for `--timeout` seconds
(its first step: `--first-step-timeout`, steps.py) records its stack as "hung", hands its
records over and ends.

Exit status of each rank: the script's own when it is not 0; else, on the global rank 0, 1 with
an error-level finding (2: the script never started a process group), and rank 0 writes
torchrun's error file (TORCHELASTIC_ERROR_FILE) so that torchrun's "FAILED" summary names the
finding, not a Python traceback; 0 on the other ranks. With `--json` the ranks' stdout goes to
stderr (file descriptor 1 onto 2) so that rank 0's stdout holds the JSON alone.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from ...launching.torchrun import end_rank
from ...launching.torchrun_world import print_uncaught
from ..checks.api import Context, Evidence
from ..errors import DoctorBug
from .core import attach_checks, install_core, record_error, run_path
from .script import (DEFAULT_TIMEOUT, WatchScriptError, refuse_unstarted, build_report,
                     error_dict, exit_status, report_dict, validate_script)
from .steps import StepClock

STORE_PREFIX = "ddp_lab_watch"


def _job_store(timeout: float):
    """A client of the job's own store (torchrun's agent hosts it at MASTER_ADDR:MASTER_PORT)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                    timeout=timedelta(seconds=timeout))


def _key(rank: int) -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{STORE_PREFIX}/{run}/{restart}/{rank}"


class _Watchdog:
    """Under torchrun: a step that has run past its time (steps.py: the first step's allowance,
    then `timeout` per step) is a hang: the main thread's stack is recorded as "hung" and the
    rank hands its records over and ends (exit 1)."""

    def __init__(self, ctx: Context, clock: StepClock, finish):
        self.ctx, self.clock, self.finish = ctx, clock, finish
        self.done = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.done.wait(0.5):
            after = self.clock.overdue()
            if after is not None:
                frames = sys._current_frames()
                main = frames.get(threading.main_thread().ident)
                stack = "".join(traceback.format_stack(main)) if main else ""
                self.ctx.emit("hung", {"step": self.ctx.step, "after": after,
                                       "line": self.ctx.user_line(main) if main else "",
                                       "stack": stack[-4000:], "at": time.time()})
                self.finish(1)


def torchrun_main(argv=None) -> int:
    """`torchrun ... -m ddp_lab.watch [--timeout S] [--json] train.py [args]`."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog=f"python -m {__package__.partition('.')[0]}.watch",
                                description="watch the training script this torchrun job runs, "
                                            "on every rank, from outside")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="seconds a step may take before the rank is reported hung")
    p.add_argument("--first-step-timeout", type=float, default=None, metavar="S",
                   help="seconds the first step may take, from the script's start (default: "
                        "the larger of 120 and 4 x --timeout)")
    p.add_argument("--json", action="store_true",
                   help="rank 0 prints the report as JSON on stdout; the script's stdout goes "
                        "to stderr")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    opts = p.parse_args(argv)
    try:
        script = validate_script(opts.script, 1, opts.timeout, opts.first_step_timeout)
    except WatchScriptError as exc:
        if opts.json:
            print(json.dumps(error_dict(exc, 2), indent=2))
        print(f"ddp-lab watch: {exc}", file=sys.stderr)
        return 2
    opts.out, opts.started = _report_stream(opts.json), time.time()
    ctx = Context(script)
    ctx.emit("script", os.path.basename(script))
    clock = StepClock(ctx, opts.timeout, opts.first_step_timeout)
    install_core(ctx)
    attach_checks(ctx, None)
    lock = threading.Lock()

    def finish(code: int) -> None:
        with lock:
            if ctx.finished:
                return
            clock.record()
            ctx.emit("exit", code)
            ctx.emit("group_started", ctx.group_started)
            ctx.finish()
            status = _hand_over(ctx, code, opts)
        end_rank(status)

    dog = _Watchdog(ctx, clock, finish)
    code = 1
    try:
        code = run_path(ctx, script, opts.args, opts.script)
    except BaseException as exc:  # noqa: BLE001 - reported, then the rank ends failed
        record_error(ctx, exc)
        tb = exc.__traceback__
        while tb is not None and not ctx.is_user_file(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next  # from the script's own frame, as Python prints it
        print_uncaught(exc, tb)
    dog.done.set()
    finish(code)
    return code


def _report_stream(as_json: bool):
    """Where rank 0 prints the report: stdout; with --json a copy of the original stdout, and
    file descriptor 1 goes to stderr for the script (its prints must not spoil the JSON)."""
    if not as_json:
        return sys.stdout
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(saved, "w")


def _hand_over(ctx: Context, code: int, opts) -> int:
    """Give this rank's records to the job's store; rank 0 collects every rank's, judges and
    prints the report. This rank's exit status (the module's docstring)."""
    import json

    wait = max(opts.timeout, opts.first_step_timeout or 0, 30) + 30  # a peer's hang is seen
    try:
        store = _job_store(wait)
        store.set(_key(ctx.rank), json.dumps(ctx.snapshot(), default=str))
    except Exception as exc:  # noqa: BLE001
        print(f"ddp-lab watch: rank {ctx.rank} could not reach the job's store: {exc}", file=sys.stderr)
        return code or 1
    if ctx.rank != 0:
        try:  # torchrun stops every rank when one ends failed: let rank 0 report first
            store.wait([_key(-1)])
        except Exception:  # noqa: BLE001 - rank 0 gone or slow: end anyway
            pass
        return code
    ranks = []
    for r in range(ctx.world_size):
        try:
            store.wait([_key(r)])
            ranks.append(json.loads(store.get(_key(r))))
        except Exception:  # noqa: BLE001 - a rank that never handed over (killed)
            ranks.append({"steps": [], "lost": True})
    try:
        return _report(ctx, code, opts, ranks)
    finally:
        store.set(_key(-1), "reported")


def _report(ctx: Context, code: int, opts, ranks: list[dict]) -> int:
    """Rank 0: the report (or the reason there is none), printed; its exit status."""
    import json

    try:
        refuse_unstarted(None, ranks, ctx.script)
    except (WatchScriptError, DoctorBug) as exc:
        status = 2 if isinstance(exc, WatchScriptError) else 3
        if opts.json:
            print(json.dumps(error_dict(exc, status), indent=2), file=opts.out, flush=True)
        print(f"ddp-lab watch: {exc}", file=sys.stderr, flush=True)
        return code or status
    ev = Evidence(ranks, run=None, script=ctx.script, world_size=ctx.world_size, args=tuple(opts.args))
    report = build_report(ev)
    report.seconds = time.time() - opts.started
    print(json.dumps(report_dict(report), indent=2) if opts.json else report.text(),
          file=opts.out, flush=True)
    own = 0 if ctx.records.get("hung") else code  # a hang is watch's finding, not the script's
    status = own or exit_status(report)
    if status and not own:
        _tell_torchrun(report)
    return status


def _tell_torchrun(report) -> None:
    """Write torchrun's error file for this rank, so that its "FAILED" summary says that watch
    found errors (torch/distributed/elastic/multiprocessing/errors: the `py_callstack` shown as
    the root cause's "traceback"), not a Python traceback that reads like a crash."""
    import json

    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    errors = report.errors
    ended = ("a step hung and watch ended the ranks (--timeout)" if report.status == "timeout"
             else "the script itself ended with status 0")
    lines = [f"ddp-lab watch: {len(errors)} error-level finding{'s' * (len(errors) != 1)} in "
             f"{report.target} (the report is above). Not a crash: {ended}; watch's exit "
             "status is 1 when it finds an error."]
    lines += [f"  {f.code}" + (f" at {f.where}" if f.where else "") for f in errors[:5]]
    data = {"message": {"message": lines[0], "extraInfo": {
        "py_callstack": "\n".join(lines), "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass
