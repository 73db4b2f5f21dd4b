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
from typing import Callable

from ._context_guard import guarded_each


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


class OptimizerHooks:
    """The checks' hooks around every optimizer's `step()` (`Context.on_optimizer_step`): one
    pre-hook and one post-hook in torch's global tables, registered when a check first asks
    (after the core's own post-hook, which ends a step), each calling the checks' functions with
    the optimizer, in the order they asked, under one guard (`guarded_each`): the core's mode is
    stepped aside once per hook, not once per check (three checks hook each: on train_ddp.py
    20 Python calls a step less, benchmarks/watch_calls.py)."""

    def __init__(self, ctx):
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)

        self.before: list[Callable] = []
        self.after: list[Callable] = []
        # guarded_each itself, not Context.guarded_each's wrapper of it: a call less per hook
        register_optimizer_step_pre_hook(lambda opt, a, k: guarded_each(ctx, self.before, (opt,)))
        register_optimizer_step_post_hook(lambda opt, a, k: guarded_each(ctx, self.after, (opt,)))

    def add(self, before: Callable | None, after: Callable | None) -> None:
        if before is not None:
            self.before.append(before)
        if after is not None:
            self.after.append(after)
