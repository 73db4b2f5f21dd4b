"""`Context.guarded_each` (context.py): the hooks that run every step (the step-end hooks, the
core's torch-function handlers) called as `guard(fn)` calls them, without a wrapper made per call.

Both also step the core's TorchFunctionMode aside while a check's code runs outside it (an
optimizer's hook, a forward pre-hook, a step end): that mode does nothing for the checks' own
calls (`ctx.checking`) but still costs a Python call for each of them, a tensor's `.shape` and
`.dim()` included. Inside the mode's own `__torch_function__` torch has already stepped it aside.
"""
from __future__ import annotations

_stack = None  # torch._C's torch-function mode stack: (len, at, pop, push), once torch is imported


def mode_aside(ctx) -> bool:
    """Pop the core's mode (ctx.mode) when it is the innermost one and torch.compile is not
    tracing; True when popped (then `mode_back`)."""
    global _stack
    mode = ctx.mode
    if mode is None:
        return False
    if _stack is None:
        import torch

        c = torch._C
        _stack = (c._len_torch_function_stack, c._get_function_stack_at,
                  c._pop_torch_function_stack, c._push_on_torch_function_stack,
                  torch.compiler.is_compiling)
    n = _stack[0]()
    if not n or _stack[1](n - 1) is not mode or _stack[4]():
        return False
    _stack[2]()
    return True


def mode_back(ctx) -> None:
    _stack[3](ctx.mode)


def guarded_each(ctx, fns, args, step_aside: bool = True) -> None:
    """Each of `fns` (a None skipped) called with `args` inside the checks (`ctx.checking`): an
    exception of one is recorded under "check-errors" and the next still runs; nothing when the
    caller is already inside the checks (as `guard`). `step_aside` False: the caller knows the
    mode is not the innermost one (the mode's own `__torch_function__`, where torch has
    stepped it aside), so `mode_aside` would only look and find it so."""
    local = ctx._local
    if getattr(local, "checking", False):
        return
    local.checking = True
    aside = step_aside and mode_aside(ctx)
    try:
        for fn in fns:
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - a check must not break the script
                ctx.add("check-errors", f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")
    finally:
        if aside:
            mode_back(ctx)
        local.checking = False
