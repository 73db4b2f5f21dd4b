"""What every rank's optimizer must agree on and do, at each `step()`:

- the same hyperparameters on every rank (each param group's lr, momentum, betas, weight decay:
  every number of the group), at every step: where they part, the first step, by how much, and
  the user's line that changed them (a scheduler stepped with a rank's own value or on some
  ranks only, `group["lr"] *= ...` under `if rank == 0`, a per-rank value at construction);
  judged for optimizers whose parameters are one model across the ranks (a wrapped model,
  DTensors, or replicas: equal on every rank when it first stepped);
- parameters that receive gradients: an optimizer whose parameters (some requiring a gradient)
  never had one in any of its steps trains nothing; its construction is the line (built before
  parallelize_module or fully_shard replaced the model's parameters, or over another model);
- fresh gradients at each step: the gradients of a step must not still hold the last step's
  (nothing zeroed them: each step applies the running sum of every earlier gradient), which is
  not deliberate accumulation (several backwards, one step, then zero_grad).

The rank side is _optimizer_rank.py (a few floats and attribute reads per step), the judge
_optimizer_judge.py.
"""
from __future__ import annotations

import functools
import sys

from ._optimizer_judge import judge
from ._optimizer_rank import OptimizerRank, numbers
from .api import Check


def attach(ctx) -> None:
    import torch
    import torch.optim.lr_scheduler as schedulers
    from torch.optim import Optimizer

    rank = OptimizerRank(ctx)
    undo = []

    def wrap(owner, name, make):
        original = vars(owner)[name]
        wrapped = functools.wraps(original)(make(original))
        setattr(owner, name, wrapped)
        undo.append(lambda: getattr(owner, name) is wrapped and setattr(owner, name, original))

    def built(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            ctx.guard(rank.made)(self, sys._getframe(1))
        return __init__

    def writer(original, what, optimizer_of):
        def call(self, *args, **kwargs):
            opt = optimizer_of(self)
            if rank.depth or opt is None or opt not in rank.tracked:
                return original(self, *args, **kwargs)
            before = ctx.guard(numbers)(opt)
            rank.depth += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                rank.depth -= 1
                ctx.guard(rank.wrote)(opt, f"{what(self)}", before, sys._getframe(1))
        return call

    wrap(Optimizer, "__init__", built)
    for name in ("load_state_dict", "add_param_group"):
        wrap(Optimizer, name, lambda o, name=name: writer(o, lambda s: f"{type(s).__name__}.{name}",
                                                          lambda s: s))
    for cls in [c for c in vars(schedulers).values() if isinstance(c, type)
                and issubclass(c, schedulers.LRScheduler) and "step" in vars(c)]:
        wrap(cls, "step", lambda o: writer(o, lambda s: f"{type(s).__name__}.step",
                                           lambda s: getattr(s, "optimizer", None)))
    ctx.on_optimizer_step(before=rank.before_step, after=rank.after_step)
    ctx.on_torch_function([torch.Tensor.zero_, torch._foreach_zero_], rank.zero)
    ctx.on_finish(lambda c: rank.summary())
    ctx.on_finish(lambda c: [u() for u in undo])


CHECK = Check(
    name="optimizer",
    mechanism="every rank's optimizer steps with the same hyperparameters, on parameters that "
              "receive gradients, on gradients of this step only",
    lesson="19",
    codes={"optimizer-hyperparameters-differ": "error", "optimizer-steps-without-gradients": "error",
           "gradients-accumulate-across-steps": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_optimizer.py",
    notes=("hyperparameters are compared for optimizers whose parameters are one model across the "
           "ranks (a wrapped model, DTensors, or equal on every rank at the first step): ranks that "
           "each train their own model may differ",
           "a direct write to a param group (group['lr'] = ...) is found in the script's source: "
           "named when one statement stores that key, listed when several do",
           "a hyperparameter held in a tensor on an accelerator is not read (it would synchronise)",
           "gradients zeroed inside a compiled function (with set_to_none=False) are not seen zeroed"))
