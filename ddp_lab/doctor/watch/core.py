"""watch's core on each rank, for a script (`script_rank`, and torchrun.py) and for the function
API (rank.py): the hooks every check relies on (a step ends when an optimizer's `step()`
returns; the models the script wraps; the process group it starts), the checks' `attach(ctx)`,
one TorchFunctionMode serving every check's `on_torch_function`, the script run as `__main__`,
and the exception it raised. What a rank records is listed in checks/api.py (RANK_KEYS).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
import types

from ...launching.frames import runner
from ...launching.rankinfo import restart_clock
from ..checks import checks_for
from ..checks._context_guard import guarded_each
from ..checks.api import Context
from ..userline import describe
from .as_main import run_as_main
from .steps import StepClock
from .unwatched import install as install_unwatched


class ScriptExit(SystemExit):
    """The script called sys.exit with a non-zero status (raised so that the launcher treats
    the rank as failed, as torchrun does; a SystemExit, so that the rank prints nothing for it,
    as Python prints nothing for sys.exit(3))."""

    def __init__(self, code):
        super().__init__(f"the script exited with status {code}")
        self.code = code


# --- rank side ---------------------------------------------------------------------------------

def install_core(ctx: Context) -> list:
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

    import torch.distributed.distributed_c10d as c10d
    import torch.distributed.device_mesh as device_mesh

    # init_device_mesh starts the default group through the name device_mesh imported
    # (torch/distributed/device_mesh.py: `from ...distributed_c10d import init_process_group`)
    for owner in (dist, c10d, device_mesh):
        if getattr(owner, "init_process_group", None) is start:
            owner.init_process_group = init_process_group
            undo.append(lambda owner=owner: setattr(owner, "init_process_group", start))
    return [*undo, install_unwatched(ctx)]  # torch's own optimizer steps and batches: unwatched.py


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


def function_mode(ctx: Context):
    """One TorchFunctionMode for every check's `on_torch_function` (and, while a check has
    switched one on, its `on_every_torch_function`), or None when no check asked. It steps
    aside while torch.compile traces and for the checks' own calls."""
    if not ctx._functions and not ctx.every_wanted:
        return None
    import torch
    from torch.overrides import TorchFunctionMode

    table = ctx._functions
    compiling = torch.compiler.is_compiling
    local = ctx._local  # ctx.checking, read without the property's call

    # Inside __torch_function__ torch has already stepped the mode aside: the handlers are
    # called through guarded_each with step_aside False (no look at the mode stack), straight
    # from the mode (no wrapper of ours between them: 5 Python calls a watched call less)
    every = ctx._every
    alone = (None,)  # what the lookup gives a function no check watches, while `every` is on

    def dispatch_all(c, handlers, args, step_aside):  # guarded_each's, then the followers
        guarded_each(c, handlers, args, step_aside)
        # on_every_torch_function's handlers run on every call: not through ctx.guard (a
        # context manager per call); the same promise, kept by hand
        local.checking = True
        try:
            for h in every:  # one that switches itself off ends this call's loop: no copy
                h(*args)
        except Exception as exc:  # noqa: BLE001 - a check must not break the script
            ctx.add("check-errors", f"{getattr(h, '__qualname__', h)}: {type(exc).__name__}: {exc}")
        finally:
            local.checking = False

    # The handlers are never traced nor compiled by dynamo: code that resumes after a graph
    # break runs under dynamo's frame callback, which would otherwise compile them as frames of
    # their own (seen by the compiled check: extra graphs and breaks in ddp_lab's files). So
    # while a callback is set they are called through torch.compiler.disable; the rest of the
    # time (every step of a script that compiles nothing) with a plain call: the disabled
    # wrapper is 5 Python calls more (two set_eval_frame, the stance, is_exporting) per call.
    callback = _eval_frame_callback()
    own_disabled = torch.compiler.disable(guarded_each, recursive=True)
    all_disabled = torch.compiler.disable(dispatch_all, recursive=True)
    watched, dispatch, disabled = table.get, guarded_each, own_disabled

    def every_changed():
        # While a check follows every call, every function has handlers (its own, or `alone`)
        # and `dispatch_all` adds the followers'; switched off, the common path below is
        # `table.get` again, one dict lookup.
        nonlocal watched, dispatch, disabled
        if every:
            watched, dispatch, disabled = (lambda f: table.get(f) or alone), dispatch_all, all_disabled
        else:
            watched, dispatch, disabled = table.get, guarded_each, own_disabled

    ctx.every_changed = every_changed
    every_changed()

    class FunctionWatch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            # Every torch call from Python passes here while the script runs: the common path
            # (a function no check watches) is one dict lookup.
            handlers = watched(func)
            if not handlers:  # None, or a list a check emptied for a while (state's, in optimizers)
                return func(*args, **kwargs) if kwargs else func(*args)
            kwargs = kwargs or {}
            if compiling() or getattr(local, "checking", False):
                return func(*args, **kwargs)
            result = func(*args, **kwargs)
            # a None in handlers: `alone`, the followers switched off while `func` ran (a gc)
            if callback() in (None, False):  # False: dynamo runs cached code only, compiles none
                dispatch(ctx, handlers, (func, args, kwargs, result), False)
            else:
                disabled(ctx, handlers, (func, args, kwargs, result), False)
            return result

    return FunctionWatch()


def _eval_frame_callback():
    """torch._C's getter of dynamo's frame callback (None or False while no frame is being
    compiled); where this torch has none, one that always answers "compiling", so that the
    handlers always take the disabled path."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:
        return lambda: True
    return get_eval_frame_callback


def attach_checks(ctx: Context, names) -> None:
    for check in checks_for("watch"):
        if check.attach is not None and (names is None or check.name in names):
            ctx.guard(check.attach)(ctx)


@runner  # the launcher's frame, not the user's: tracebacks start at the script's own
def run_path(ctx: Context, path: str, args, argv0: str | None = None) -> int:
    """Run the script as `__main__`, as `python train.py` runs it (as_main.py); its exit status
    (an exception propagates). `argv0`: the script's path as the user gave it."""
    mode = ctx.mode = function_mode(ctx)
    ctx.emit("started", True)
    with mode or contextlib.nullcontext():
        return run_as_main(path, args, argv0)


def record_error(ctx: Context, exc: BaseException) -> None:
    """The exception the user's code raised, recorded under "error" (api.RANK_KEYS)."""
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


@runner
def script_rank(path: str, args, folder: str, names=None, argv0: str | None = None,
                clock: tuple | None = None) -> dict:
    """One launched rank: the checks attached, the script run; plain data back. `clock`:
    (timeout, first-step timeout) of the per-step clock (steps.py)."""
    ctx = Context(path, os.path.join(folder, f"rank{os.environ.get('RANK', '0')}.jsonl"))
    ctx.emit("script", os.path.basename(path))
    steps = StepClock(ctx, *(clock or (None, None)), restart=restart_clock)
    install_core(ctx)
    attach_checks(ctx, names)
    code = 1
    try:
        code = run_path(ctx, path, args, argv0)
    except BaseException as exc:
        record_error(ctx, exc)
        raise
    finally:
        steps.record()
        ctx.emit("exit", code)
        ctx.emit("group_started", ctx.group_started)
        ctx.finish()
    if code:
        raise ScriptExit(code)
    return {"exit": code, "steps": ctx.step}
