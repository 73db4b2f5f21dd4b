"""Watching one forward and backward pass from inside a rank: tensors created in `forward`
without a device, `nn.Parameter`s created in `forward`, collectives called from `forward`
(recorded with `ddp_lab.instruments.probes.record_collectives`), reentrant checkpoints and custom autograd
Functions in the graph, and the warnings PyTorch gave. Everything is reported as plain data."""
from __future__ import annotations

import warnings
from contextlib import ExitStack, contextmanager

from ...instruments.probes import Timeline, record_collectives
from ..frames import user_frame
from .regions import watch_checkpoints

FACTORIES = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace",
             "logspace", "eye", "tensor", "as_tensor", "zeros_like", "ones_like"}


def _torch_function_mode():
    import torch
    from torch.overrides import TorchFunctionMode

    class DevicelessFactories(TorchFunctionMode):
        """Records factory calls from user code that give no device (they land on the CPU)."""

        def __init__(self):
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            if (name in FACTORIES and "device" not in kwargs and not name.endswith("_like")
                    and isinstance(out, torch.Tensor) and out.dim() > 0):
                frame = user_frame()
                where = f"torch.{name}(...) at {frame}"
                if frame and where not in self.calls:
                    self.calls.append(where)
            return out

    return DevicelessFactories()


class _CallerTimeline(Timeline):
    """A Timeline that also notes where in the user's code each collective was called."""

    def __init__(self):
        super().__init__()
        self.callers: list[str] = []

    @contextmanager
    def span(self, name: str):
        self.callers.append(f"{name}() from {user_frame() or 'inside torch'}")
        with super().span(name):
            yield


@contextmanager
def _parameter_births(births: list[str]):
    import torch.nn as nn

    original = nn.Parameter.__dict__["__new__"]

    def new(cls, *args, **kwargs):
        frame = user_frame()
        if frame:
            births.append(f"{cls.__name__} created at {frame}")
        return original.__func__(cls, *args, **kwargs)

    nn.Parameter.__new__ = staticmethod(new)
    try:
        yield
    finally:
        nn.Parameter.__new__ = original


@contextmanager
def watch_forward(record: dict, dev_type: str = "cpu"):
    """Inside the block, record into `record`: "factories", "parameter_births", "collectives",
    "checkpoints" (see regions.watch_checkpoints), "warnings"."""
    births: list[str] = []
    checkpoints: list[dict] = []
    with ExitStack() as stack:
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        timeline = stack.enter_context(record_collectives(_CallerTimeline()))
        mode = stack.enter_context(_torch_function_mode())
        stack.enter_context(_parameter_births(births))
        stack.enter_context(watch_checkpoints(checkpoints, user_frame, dev_type))
        try:
            yield
        finally:
            record["factories"] = list(mode.calls)
            record["parameter_births"] = sorted(set(births))
            record["collectives"] = list(timeline.callers)
            record["checkpoints"] = checkpoints
            record["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})


@contextmanager
def batchnorm_sizes(model, sizes: dict):
    """Inside the block, `sizes[name]` is how many values per channel each BatchNorm layer of
    `model` normalises over in one forward (N for (N, C), N*H*W for (N, C, H, W))."""
    from torch.nn.modules.batchnorm import _BatchNorm

    def hook(name):
        def pre(module, args):
            x = args[0] if args else None
            if x is not None and getattr(x, "dim", lambda: 0)() >= 2:
                sizes[name] = int(x.numel() // x.shape[1])
        return pre

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
               if isinstance(m, _BatchNorm)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def custom_functions(roots) -> dict[str, bool]:
    """The custom autograd Functions in the graph below `roots` (tensors), each with whether its
    forward is decorated with torch.amp.custom_fwd."""
    seen, todo = set(), [getattr(t, "grad_fn", None) for t in roots]
    out: dict[str, bool] = {}
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        cls = getattr(node, "_forward_cls", None)
        if cls is not None and cls.__module__ != "torch.utils.checkpoint":
            fwd = cls.__dict__.get("forward")
            fn = getattr(fwd, "__func__", fwd)
            code = getattr(fn, "__code__", None)
            decorated = bool(code and code.co_name == "decorate_fwd") or hasattr(node, "_fwd_used_autocast")
            out[cls.__qualname__] = decorated
        todo += [n for n, _ in getattr(node, "next_functions", ())]
    return out
