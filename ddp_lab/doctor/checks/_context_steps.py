"""Which optimizer's `step()` ends a step of the user's loop (context.py, `Context.step_ended`):
part of the floor.

The rule: the first optimizer to step counts; then the newest optimizer of the same parameters
(one that shares a parameter with the one that counts and never stepped before takes over: a
resume that builds a new optimizer and loads the old one's state), or any optimizer once the one
that counted is gone. Optimizers are held weakly (the script owns them: a rebuilt one's old
state is freed when the script drops it). An optimizer over other parameters (a GAN's second)
steps inside the step; one that was replaced never ends a step again.
"""
from __future__ import annotations

import weakref


class StepOptimizer:
    def __init__(self):
        self._current = None  # weakref to the optimizer whose step ends a step
        self._stepped = weakref.WeakSet()  # every optimizer that ever stepped

    def counts(self, optimizer) -> bool:
        """Whether `optimizer`'s step (just returned) ends a step: the rule above."""
        current = self._current() if self._current is not None else None
        new = optimizer not in self._stepped
        self._stepped.add(optimizer)
        if current is optimizer:
            return True
        if current is None or (new and _shares_parameter(optimizer, current)):
            self._current = weakref.ref(optimizer)
            return True
        return False


def _shares_parameter(a, b) -> bool:
    """Two optimizers with a parameter in common (their param groups)."""
    mine = {id(p) for g in getattr(b, "param_groups", ()) for p in g.get("params", ())}
    return any(id(p) in mine for g in getattr(a, "param_groups", ()) for p in g.get("params", ()))
