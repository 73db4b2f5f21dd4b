"""The per-step clock of a watched rank: `--timeout` is per step, and the first step has an
allowance of its own (`--first-step-timeout`).

A step is what checks/context.py says it is: from the end of the previous optimizer step (for
the first, from the script's start: its imports, data loading, any compile) to the end of this
one. What follows the last step (an evaluation, the saving) is a step that never ends, with the
step timeout.

- A launched rank (script.py): the launcher stops the ranks whose clock ran out, with every
  rank's stack and flight record (launching/launcher.py). The clock starts, with the first-step
  allowance, when the rank is ready; each step's end restarts it (`restart_clock`, a file the
  launcher watches) with `timeout + SLACK` s, at most once every SLACK s: a step always has at
  least its timeout, at most SLACK s more, and a loop of 2 ms steps writes no file per step.
- Under torchrun (torchrun.py) there is no launcher: a thread on each rank reads `overdue()`.

It also times the checks' step-end hooks (what `--cost` shows): "step-hooks" in the records.
"""
from __future__ import annotations

import time

SLACK = 0.25  # seconds: how often at most a step's end restarts the launcher's clock
FIRST_STEP_MIN = 120.0
FIRST_STEP_FACTOR = 4


def first_step_allowance(timeout: float, first: float | None = None) -> float:
    """The first step's allowance: `first` when given, else the larger of 120 s and four times
    the step timeout (imports, data loading and compiling on a loaded machine)."""
    return float(first) if first is not None else max(FIRST_STEP_MIN, FIRST_STEP_FACTOR * timeout)


class StepClock:
    """Wraps `ctx.step_ended` (the core's optimizer hook calls it): restarts the launcher's
    clock (`restart`, when given) and times the step-end hooks."""

    def __init__(self, ctx, timeout: float | None, first: float | None, restart=None):
        self.ctx, self.timeout, self.restart = ctx, timeout, restart
        self.first = first_step_allowance(timeout, first) if timeout is not None else None
        self.started = time.time()
        self.marked = 0.0  # time.monotonic() of the last restart
        self.hook_seconds, self.hook_max, self.hooks = 0.0, 0.0, 0
        ended = ctx.step_ended

        def step_ended(optimizer):
            before, t0 = ctx.step, time.perf_counter()
            ended(optimizer)
            if ctx.step == before:  # a second optimizer inside the step: not a step's end
                return
            spent = time.perf_counter() - t0
            self.hook_seconds, self.hooks = self.hook_seconds + spent, self.hooks + 1
            self.hook_max = max(self.hook_max, spent)
            now = time.monotonic()
            if self.restart is not None and self.timeout is not None and now - self.marked >= SLACK:
                self.marked = now
                self.restart(self.timeout + SLACK)

        ctx.step_ended = step_ended
        self.record()  # the clock's settings, for a rank that is stopped before it ends

    def overdue(self, now: float | None = None) -> float | None:
        """The seconds allowed to the step under way when it has run past them, else None."""
        if self.timeout is None:
            return None
        now = time.time() if now is None else now
        if self.ctx.step == 0:
            return self.first if now - self.started > self.first else None
        begun = self.ctx.steps[-1]["begin"]
        return self.timeout if now - begun > self.timeout else None

    def record(self) -> None:
        self.ctx.emit("step-hooks", {"steps": self.hooks, "seconds": round(self.hook_seconds, 6),
                                     "max": round(self.hook_max, 6),
                                     "timeout": self.timeout, "first": self.first})
