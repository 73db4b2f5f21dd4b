"""What `Context.on_built` wraps (context.py): a class's `__init__`, so that the checks hear of
each instance the script builds (an optimizer, an LR scheduler, a GradScaler): part of the floor."""
from __future__ import annotations

import functools
import sys


def built_init(ctx, init):
    """`init` wrapped: after the outermost constructor returns, each `on_built` callback whose
    class the object is (never during the checks' own builds)."""
    @functools.wraps(init)
    def built(obj, *args, **kwargs):
        depth = getattr(ctx._local, "building", 0)
        ctx._local.building = depth + 1
        try:
            init(obj, *args, **kwargs)
        finally:
            ctx._local.building = depth
        if depth == 0 and not ctx.checking:
            for cls, fns in ctx._built.items():
                for fn in fns if isinstance(obj, cls) else ():
                    ctx.guard(fn)(ctx, obj, sys._getframe(1))

    built._watched = True
    return built


def subclasses(cls) -> list:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *subclasses(sub)]
    return found
