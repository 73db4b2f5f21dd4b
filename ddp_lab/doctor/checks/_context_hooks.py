"""`UserHook`: the one way a check hooks an object of the user's (a module, an optimizer, a tensor),
so that the script's own `torch.save(model)`, `pickle.dumps(model)` and `copy.deepcopy(model)` (an
EMA copy) work under watch as they work under torchrun.

Why it is needed (torch 2.13): `nn.Module.__getstate__` (torch/nn/modules/module.py:1919) is the
module's whole `__dict__`, so a whole-model `torch.save` pickles every hook in `_forward_pre_hooks`,
`_forward_hooks`, `_backward_hooks`, `_state_dict_hooks`, ... by value: a check's closure (or
`Context.guard`'s `guarded`) raises "Can't pickle local object", and a bound method would drag the
check and its context (open files) along. `copy.deepcopy` has no `__deepcopy__` on Module: it goes
through the same `__reduce_ex__`/`__getstate__` and deep-copies each hook (a plain function is shared,
a bound method's object is copied). The handles (torch/utils/hooks.py RemovableHandle) hold only
weak references to those dicts, so they never travel. `Optimizer.__getstate__`
(torch/optim/optimizer.py:412) keeps defaults, state and param_groups only: an optimizer's hooks are
dropped by torch itself; a tensor's backward hooks are not pickled, with a warning for each hook
not marked `__torch_unserializable__` (torch/utils/hooks.py:83, from torch/_tensor.py:319):
UserHook carries the mark (no warning the script would not print under torchrun).

The rule: a check's hook belongs to the object it was registered on, in this process. Pickled or
deep-copied, it becomes `functools.partial(sys.audit, INERT)`: a standard-library no-op that takes
any positional arguments and returns None (a hook's "change nothing"), pickled by reference to
`sys.audit`, so a checkpoint written under watch loads where ddp-lab is not installed, and a copy
(the EMA model, a reloaded model, the checkpoints check's own fresh copy) carries a hook that
does nothing, as the copy would carry none under torchrun. The check's function and its context
are never copied. `copy.copy(model)` shares the module's hook dicts (torch's shallow copy), so
its hooks stay live, as a user's own would.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable

INERT = "ddp-lab watch: an inert hook"  # the audit event the inert copy raises (none listens)


def inert() -> Callable:
    """What a pickled or deep-copied UserHook becomes (see the module's docstring)."""
    return functools.partial(sys.audit, INERT)


class UserHook:
    """A check's hook on a user's object: `fn(*args)` when the object calls it (`guard`: the
    context's guard around it, so the check's exception never reaches the script); pickled or
    deep-copied, an inert no-op (module docstring)."""

    __slots__ = ("fn", "__weakref__")
    __torch_unserializable__ = True  # a tensor's torch.save warns of every other hook

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (functools.partial, (sys.audit, INERT))

    def __repr__(self) -> str:
        return f"<ddp-lab watch hook {getattr(self.fn, '__qualname__', self.fn)}>"


class HandlerSwitch:
    """A check's torch-function handler that is in the core's table only for a while
    (`Context.handler_switch`): `set(True)` appends it to the handler list of each of `funcs`,
    `set(False)` takes it out; no call of `funcs` pays it the rest of the time. The lists are
    the core's own for the whole run, found once."""

    __slots__ = ("table", "funcs", "handler", "lists", "on")

    def __init__(self, table: dict, funcs, handler: Callable):
        self.table, self.funcs, self.handler = table, list(funcs), handler
        self.lists: list | None = None
        self.on = False

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        if self.lists is None:
            self.lists = [self.table.setdefault(f, []) for f in self.funcs]
        self.on = on
        handler = self.handler
        for handlers in self.lists:
            if on:
                handlers.append(handler)
            elif handler in handlers:
                handlers.remove(handler)
