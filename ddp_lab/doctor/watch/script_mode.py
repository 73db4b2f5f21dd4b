"""`ddp-lab watch train.py [args]`: the user's script, unchanged, on real ranks, with every
registered check (ddp_lab/doctor/checks) attached from outside.

Under the launcher (`watch_script`), each rank runs `script_rank`: the core's hooks and the
checks' `attach(ctx)`, then the script as `__main__` with the environment torchrun gives
(RANK, WORLD_SIZE, MASTER_ADDR/PORT on the launcher's store; the script calls its own
init_process_group). Each rank writes its records to a file as it goes (a rank that hangs or is
killed still told what it saw); the parent reads them, with the launch's flight record and
stacks, into one `Evidence` that every check judges.

Inside torchrun (`torchrun ... -m ddp_lab.watch train.py`, `torchrun_main`), there is no
launcher: each rank runs the script the same way, then hands its records to the job's own
store (a client of torchrun's store, never a collective in the training group); rank 0 judges
and prints the report. A rank whose step has not ended for `--timeout` seconds records every
thread's stack as "hung", hands its records over and ends.
"""
from __future__ import annotations

import contextlib
import os
import runpy
import types
import sys
import tempfile
import threading
import time
import traceback

from .context import Context, Evidence, describe, read_records

DEFAULT_TIMEOUT = 60.0


class ScriptExit(Exception):
    """The script called sys.exit with a non-zero status (raised so that the launcher treats
    the rank as failed, as torchrun does)."""

    def __init__(self, code):
        super().__init__(f"the script exited with status {code}")
        self.code = code


# --- rank side ---------------------------------------------------------------------------------

def _install_core(ctx: Context) -> list:
    """Step boundaries, the models the script wraps, the process group it starts. Returns
    undo callables (used by tests that run a script in this process)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    undo = []
    handle = register_optimizer_step_post_hook(
        lambda opt, args, kwargs: ctx.step_ended(opt))
    undo.append(handle.remove)

    init = DistributedDataParallel.__init__

    def ddp_init(self, module, *args, **kwargs):
        init(self, module, *args, **kwargs)
        ctx.model_wrapped("ddp", self, module, sys._getframe(1))

    DistributedDataParallel.__init__ = ddp_init
    undo.append(lambda: setattr(DistributedDataParallel, "__init__", init))

    compile_ = torch.compile

    def compile_watched(model=None, *args, **kwargs):
        if model is None:  # used as @torch.compile(...): a decorator factory
            return lambda fn: compile_watched(fn, *args, **kwargs)
        out = compile_(model, *args, **kwargs)
        if isinstance(model, torch.nn.Module):
            ctx.model_wrapped("compiled", out, model, sys._getframe(1))
            ctx.add("compile-settings", {"line": ctx.user_line(sys._getframe(1)),
                                         **{k: repr(v) for k, v in kwargs.items()}})
            if isinstance(getattr(out, "__dict__", {}).get("forward"), types.FunctionType) or \
                    callable(getattr(out, "__dict__", {}).get("forward")):
                out.forward = _outside_the_mode(ctx, out.forward)
            return out
        return _outside_the_mode(ctx, out) if callable(out) else out

    torch.compile = compile_watched
    undo.append(lambda: setattr(torch, "compile", compile_))

    try:
        import torch.distributed.fsdp as fsdp_pkg
        import torch.distributed.fsdp._fully_shard as fsdp_impl
        shard = fsdp_pkg.fully_shard

        def fully_shard(module, *args, **kwargs):
            out = shard(module, *args, **kwargs)
            for m in (module if isinstance(module, (list, tuple)) else [module]):
                ctx.model_wrapped("fsdp2", out, m, sys._getframe(1))
            return out

        for owner in (fsdp_pkg, fsdp_impl):
            setattr(owner, "fully_shard", fully_shard)
            undo.append(lambda owner=owner: setattr(owner, "fully_shard", shard))
    except (ImportError, AttributeError):
        pass

    start = dist.init_process_group

    def init_process_group(*args, **kwargs):
        out = start(*args, **kwargs)
        if ctx.step == 0:  # step 0 is timed from here: imports and rendezvous are not a step
            ctx.steps[0]["begin"] = time.time()
            ctx._write({"step": 0, "begin": ctx.steps[0]["begin"]})
        ctx.group_started = True
        ctx.emit("group", {"backend": dist.get_backend(), "line": ctx.user_line(sys._getframe(1))})
        return out

    dist.init_process_group = init_process_group
    import torch.distributed.distributed_c10d as c10d
    c10d.init_process_group = init_process_group
    undo.append(lambda: setattr(dist, "init_process_group", start))
    undo.append(lambda: setattr(c10d, "init_process_group", start))
    return undo


def _outside_the_mode(ctx: Context, fn):
    """`fn` (what torch.compile returned) called with watch's TorchFunctionMode popped, so that
    dynamo traces the user's code as it would without watch (an active mode is part of what
    dynamo traces: it changed the graph breaks it found)."""
    import functools

    from torch.overrides import _get_current_function_mode, _pop_mode_temporarily

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if ctx.mode is not None and _get_current_function_mode() is ctx.mode:
            with _pop_mode_temporarily():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def _function_mode(ctx: Context):
    """One TorchFunctionMode for every check's `on_torch_function`, or None when no check
    asked. It steps aside while torch.compile traces and for the checks' own calls."""
    if not ctx._functions:
        return None
    import torch
    from torch.overrides import TorchFunctionMode

    table = ctx._functions
    compiling = torch.compiler.is_compiling

    @torch.compiler.disable(recursive=True)
    def dispatch(handlers, func, args, kwargs, result):
        # Never traced nor compiled by dynamo: code that resumes after a graph break runs under
        # dynamo's frame callback, which would otherwise compile the checks' handlers as frames
        # of their own (seen by the compiled check: extra graphs and breaks in ddp_lab's files).
        for h in handlers:
            ctx.guard(h)(func, args, kwargs, result)

    watched = table.get

    class FunctionWatch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            # Every torch call from Python passes here while the script runs: the common path
            # (a function no check watches) is one dict lookup.
            handlers = watched(func)
            if not handlers:  # None, or a list a check emptied for a while (state's, in optimizers)
                return func(*args, **kwargs) if kwargs else func(*args)
            kwargs = kwargs or {}
            if compiling() or ctx.checking:
                return func(*args, **kwargs)
            result = func(*args, **kwargs)
            dispatch(handlers, func, args, kwargs, result)
            return result

    return FunctionWatch()


def _attach_checks(ctx: Context, names) -> None:
    from ..checks import checks_for

    for check in checks_for("watch"):
        if check.attach is not None and (names is None or check.name in names):
            ctx.guard(check.attach)(ctx)


def _run_path(ctx: Context, path: str, args) -> int:
    """Run the script as `__main__`; its exit status (an exception propagates)."""
    sys.argv = [path, *map(str, args)]
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mode = ctx.mode = _function_mode(ctx)
    ctx.emit("started", True)
    try:
        with mode or contextlib.nullcontext():
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) else 1
    return 0


def _record_error(ctx: Context, exc: BaseException) -> None:
    tb = exc.__traceback__
    line = ""
    for frame, lineno in traceback.walk_tb(tb):
        if ctx.is_user_file(frame.f_code.co_filename):
            line = describe(frame.f_code.co_filename, lineno)  # the innermost of the user's
    while tb is not None and not ctx.is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next  # the traceback from the user's first frame, not the runner's
    ctx.emit("error", {"type": type(exc).__name__, "message": str(exc)[:2000], "line": line,
                       "traceback": "".join(traceback.format_exception(type(exc), exc, tb))[-6000:],
                       "step": ctx.step, "at": time.time()})


def script_rank(path: str, args, folder: str, names=None) -> dict:
    """One launched rank: the checks attached, the script run; plain data back."""
    ctx = Context(path, os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.jsonl"))
    ctx.emit("script", os.path.basename(path))
    _install_core(ctx)
    _attach_checks(ctx, names)
    code = 1
    try:
        code = _run_path(ctx, path, args)
    except BaseException as exc:
        _record_error(ctx, exc)
        raise
    finally:
        ctx.emit("exit", code)
        ctx.emit("group_started", ctx.group_started)
        ctx.finish()
    if code:
        raise ScriptExit(code)
    return {"exit": code, "steps": ctx.step}


# --- parent side -------------------------------------------------------------------------------

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
                 checks=None, progress=None):
    """Run `path` (a training script, as `torchrun --nproc-per-node nproc path args` would) on
    real ranks with every watch check attached; the `Report`. Raises WatchScriptError when the
    script cannot be watched. `checks`: names of the checks to attach (default: all)."""
    import shutil

    from ...launching.launcher import launch

    script = validate_script(path, nproc, timeout)
    folder = tempfile.mkdtemp(prefix="ddp-lab-watch-")
    try:
        with (_Progress(folder, nproc, os.path.basename(path), progress) if progress
              else contextlib.nullcontext()):
            run = launch(script_rank, script, list(args), folder, checks, world_size=nproc,
                         timeout=timeout, init_process_group=False, grace=2.0,
                         label=f"watch {os.path.basename(path)}")
        ranks = [read_records(os.path.join(folder, f"rank{r}.jsonl")) for r in range(nproc)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _refuse_unstarted(run, ranks, path)
    ev = Evidence(ranks, run=run, script=script, world_size=nproc, args=tuple(args))
    return build_report(ev, checks)


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
        from ..inputs import DoctorBug
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


def build_report(ev: Evidence, checks=None):
    from ..checks import checks_for
    from ..report import Finding, Report

    found: list[Finding] = []
    notes = []
    for check in checks_for("watch"):
        if checks is not None and check.name not in checks:
            continue
        try:
            found += check.judge(ev) or []
        except Exception as exc:  # noqa: BLE001 - one check's bug must not hide the others
            notes.append(f"check {check.name} failed on this run ({type(exc).__name__}: {exc}); "
                         "its findings are missing")
    from ..checks import BROKEN
    notes += [f"check {name} is missing: it did not import ({why})" for name, why in BROKEN.items()]
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
    report = Report(os.path.basename(ev.script), ev.world_size, steps, None, _dedupe(found),
                    status=status, run=ev.run, notes=notes, strategy=strategy, tool="watch")
    codes = [r.get("exit") for r in ev.ranks if isinstance(r.get("exit"), int)]
    report.script_status = next((c for c in codes if c), 0)
    report.evidence = ev  # what the checks judged (tests and notebooks read it)
    return report


def _dedupe(found):
    seen, out = set(), []
    for f in found:
        key = (f.code, f.title, f.where)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def exit_status(report) -> int:
    """The CLI's: the script's own non-zero status, else 1 with an error-level finding, else 0."""
    return getattr(report, "script_status", 0) or report.exit_status


# --- inside torchrun -----------------------------------------------------------------------------

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
    _install_core(ctx)
    _attach_checks(ctx, None)
    lock = threading.Lock()

    def finish(code: int) -> None:
        with lock:
            if ctx.finished:
                return
            ctx.emit("exit", code)
            ctx.emit("group_started", ctx.group_started)
            ctx.finish()
            status = _hand_over(ctx, code, opts)
        from ...launching.torchrun import end_rank
        end_rank(status)

    dog = _Watchdog(ctx, opts.timeout, finish)
    code = 1
    try:
        code = _run_path(ctx, script, opts.args)
    except BaseException as exc:  # noqa: BLE001 - reported, then the rank ends failed
        _record_error(ctx, exc)
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
