"""`Context.guarded_each` (context.py): the hooks that run every step (the step-end hooks, the
core's torch-function handlers) called as `guard(fn)` calls them, without a wrapper made per call.
"""
from __future__ import annotations


def guarded_each(ctx, fns, args) -> None:
    """Each of `fns` (a None skipped) called with `args` inside the checks (`ctx.checking`): an
    exception of one is recorded under "check-errors" and the next still runs; nothing when the
    caller is already inside the checks (as `guard`)."""
    local = ctx._local
    if getattr(local, "checking", False):
        return
    local.checking = True
    try:
        for fn in fns:
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - a check must not break the script
                ctx.add("check-errors", f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")
    finally:
        local.checking = False
