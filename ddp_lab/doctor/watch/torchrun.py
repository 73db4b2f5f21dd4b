"""watch inside a torchrun job (`torchrun ... -m ddp_lab.watch train.py`, `torchrun_main`):
there is no launcher; each rank runs the script as core.py runs it, then hands its records to
the job's own store (a client of torchrun's store, never a collective in the training group);
rank 0 judges and prints the report. A rank whose step has not ended for `--timeout` seconds
records every thread's stack as "hung", hands its records over and ends.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from ...launching.torchrun import end_rank
from ..checks.api import Context, Evidence
from .core import attach_checks, install_core, record_error, run_path
from .script import DEFAULT_TIMEOUT, WatchScriptError, build_report, exit_status, validate_script

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
    """Under torchrun: a step that has not ended for `timeout` seconds is a hang: every thread's
    stack is recorded as "hung" and the rank hands its records over and ends (exit 1)."""

    def __init__(self, ctx: Context, timeout: float, finish):
        self.ctx, self.timeout, self.finish = ctx, timeout, finish
        self.done = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.done.wait(0.5):
            last = self.ctx.steps[-1]["begin"]
            if self.ctx.group_started and time.time() - last > self.timeout:
                frames = sys._current_frames()
                main = frames.get(threading.main_thread().ident)
                stack = "".join(traceback.format_stack(main)) if main else ""
                self.ctx.emit("hung", {"step": self.ctx.step, "after": self.timeout,
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
    p.add_argument("--json", action="store_true", help="rank 0 prints the report as JSON")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    opts = p.parse_args(argv)
    try:
        script = validate_script(opts.script, 1, opts.timeout)
    except WatchScriptError as exc:
        print(f"ddp-lab watch: {exc}", file=sys.stderr)
        return 2
    ctx = Context(script)
    ctx.emit("script", os.path.basename(script))
    install_core(ctx)
    attach_checks(ctx, None)
    lock = threading.Lock()

    def finish(code: int) -> None:
        with lock:
            if ctx.finished:
                return
            ctx.emit("exit", code)
            ctx.emit("group_started", ctx.group_started)
            ctx.finish()
            status = _hand_over(ctx, code, opts)
        end_rank(status)

    dog = _Watchdog(ctx, opts.timeout, finish)
    code = 1
    try:
        code = run_path(ctx, script, opts.args)
    except BaseException as exc:  # noqa: BLE001 - reported, then the rank ends failed
        record_error(ctx, exc)
        traceback.print_exc()
    dog.done.set()
    finish(code)
    return code


def _hand_over(ctx: Context, code: int, opts) -> int:
    """Give this rank's records to the job's store; rank 0 collects every rank's, judges and
    prints the report. This rank's exit status."""
    import json

    try:
        store = _job_store(max(opts.timeout, 30))
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
    ev = Evidence(ranks, run=None, script=ctx.script, world_size=ctx.world_size, args=tuple(opts.args))
    report = build_report(ev)
    print(report.to_json() if opts.json else report.text(), flush=True)
    store.set(_key(-1), "reported")
    return code or exit_status(report)
