"""Torch's own code that no check's handler reads, run outside watch's TorchFunctionMode.

While the mode is on, every torch call from Python pays a Python call (an empty mode: about
3 µs a call, docs/watch.md "What it costs"). Of a small DDP step's calls, more than half are
torch's own work that no check's handler reads:

- a `torch.optim` optimizer's `step()`: its update's in-place ops (the state check mutes itself
  there: they are the optimizer's, not a hand edit) and its `.grad` reads;
- its `zero_grad()` setting the gradients to None (`set_to_none=True`, torch's default: property
  sets no check reads; `zero_grad(set_to_none=False)` zeroes with `zero_`, which the optimizer
  check reads, and stays watched);
- a DataLoader's iterator fetching the next batch (the dataset's indexing, the collate's stack).

An optimizer whose `step` the script wrote stays watched (its code is the user's; torch's step it
calls through `super().step()` is not), and so does torch.distributed.optim's (its step issues
collectives). Nothing steps aside while a check follows every call (`on_every_torch_function`:
the collectives check after an async collective, where a torch step reading the gradient before
`wait()` is the bug it looks for), nor while torch.compile traces.

The classes are wrapped once per process; the wrappers step aside the mode of the Context
installed now (a rank has one; tests install one after another).
"""
from __future__ import annotations

import functools
import inspect

from ..checks._context_built import subclasses
from ..checks._context_guard import mode_aside, mode_back

_current: list = [None]  # the Context whose mode the wrappers step aside


def install(ctx):
    """Make `ctx` the one whose mode the wrappers step aside; wrap torch.optim's optimizers'
    step and zero_grad and the DataLoader's iterator (once per process). Returns the undo."""
    from torch.optim import Optimizer
    from torch.utils.data import dataloader

    _current[0] = ctx
    if not getattr(Optimizer, "_ddp_lab_unwatched", False):
        Optimizer._ddp_lab_unwatched = True
        _wrap(dataloader._BaseDataLoaderIter, "__next__", "torch.utils.data.")
        for cls in [Optimizer, *subclasses(Optimizer)]:
            _wrap(cls, "step", "torch.optim.")
            _wrap(cls, "zero_grad", "torch.optim.", when=_to_none)
    return lambda: _current[0] is ctx and _current.__setitem__(0, None)


def _wrap(owner, name: str, package: str, when=None) -> None:
    fn = vars(owner).get(name)  # its own, not an inherited one (wrapped at its class)
    if fn is None or not getattr(inspect.unwrap(fn), "__module__", "").startswith(package):
        return  # torch.distributed.optim's step issues collectives: watched

    import torch

    compiling = torch.compiler.is_compiling

    @functools.wraps(fn)  # keeps torch's `hooked` (optimizer.py: its step hooks added once)
    def call(*args, **kwargs):
        ctx = _current[0]
        if ctx is None or compiling() or ctx._every or (when is not None and not when(*args, **kwargs)) \
                or not mode_aside(ctx):
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            mode_back(ctx)

    setattr(owner, name, call)


def _to_none(self, set_to_none: bool = True) -> bool:
    return bool(set_to_none)

