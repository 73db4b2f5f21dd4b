"""What the doctor is given, made uniform: the model (a class, a zero-argument factory or an
instance), the example input (a tensor, a tuple of positional arguments, a dict of keyword
arguments, or a callable rank -> batch) and how its shape may vary between ranks, the loss, the
user's DDP settings, and autocast. (Loading `path/to/file.py:Name` for the CLI is loader.py's
job.)"""
from __future__ import annotations

import copy
import inspect
import re
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

from ..batch import call, floating_tensors, map_tensors, tensors_in
from ..errors import DoctorInputError
from ..frames import last_frames as _last_frames

AMP_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
_FIT = re.compile(r"shape|size mismatch|must match the size|cannot be multiplied|[Ee]xpected input|"
                  r"Expected \d+D|dimension|channels|out of range|Expected size|size of tensor|"
                  r"input of size|batch_size|positional argument|keyword argument|unpack")


@dataclass
class ModelSource:
    """How each rank gets its model: a class or factory called there, or an instance shipped
    by value (each rank receives its own copy)."""

    obj: Any
    kind: str  # "class", "factory", "instance"
    name: str

    def build(self):
        import torch.nn as nn

        if self.kind == "instance":
            return copy.deepcopy(self.obj)
        model = self.obj()
        if not isinstance(model, nn.Module):
            raise DoctorInputError(f"{self.name} returned a {type(model).__name__}, not an nn.Module")
        return model


def _callable_name(fn) -> str:
    """`make_model()`; a functools.partial shows its arguments: `Net(RunningCenter, width=4)`."""
    inner = getattr(fn, "func", None)
    if inner is None:
        return f"{getattr(fn, '__name__', type(fn).__name__)}()"
    args = [getattr(a, "__name__", None) or repr(a)[:20] for a in fn.args]
    args += [f"{k}={getattr(v, '__name__', None) or repr(v)[:20]}" for k, v in fn.keywords.items()]
    return f"{getattr(inner, '__name__', type(inner).__name__)}({', '.join(args)})"


def resolve_model(model) -> ModelSource:
    import torch.nn as nn

    if isinstance(model, nn.Module):
        return ModelSource(model, "instance", f"{type(model).__name__} instance")
    if inspect.isclass(model):
        if not issubclass(model, nn.Module):
            raise DoctorInputError(f"{model.__name__} is not an nn.Module subclass")
        return ModelSource(model, "class", model.__name__)
    if callable(model):
        return ModelSource(model, "factory", _callable_name(model))
    raise DoctorInputError(f"the model must be an nn.Module class, a factory or an instance, "
                           f"got {type(model).__name__}")


def first_instance(source: ModelSource):
    """One instance for the static checks; a factory that raises is bad input."""
    try:
        return source.build()
    except DoctorInputError:
        raise
    except Exception as exc:
        raise DoctorInputError(f"building {source.name} raised {type(exc).__name__}: {exc}\n"
                               + _last_frames(exc)) from exc


# ---- the input -------------------------------------------------------------------------------

def perturb(value, rank: int):
    """The example input made distinct per rank: floats get rank-scaled noise, integer tensors
    are rolled along the batch dimension; tuples, lists and dicts item by item."""
    import torch

    def one(t):
        if rank == 0:
            return t.clone()
        if t.is_floating_point():
            g = torch.Generator().manual_seed(rank)
            noise = torch.randn(t.shape, generator=g).to(t.dtype).to(t.device)
            return t + 0.1 * rank * noise
        return torch.roll(t, rank, 0) if t.dim() and t.shape[0] > 1 else t.clone()
    return map_tensors(value, one)


def batch_for(example, rank: int):
    """The batch rank `rank` feeds the model (shapes.rank_batch may then cut its length)."""
    return example(rank) if callable(example) else perturb(example, rank)


def autocast(amp: str | None, device_type: str):
    import torch

    if not amp:
        return nullcontext()
    return torch.autocast(device_type=device_type, dtype=getattr(torch, AMP_DTYPES[amp]))


def validate_amp(amp):
    if amp not in (None, *AMP_DTYPES):
        raise DoctorInputError(f"amp must be one of {', '.join(AMP_DTYPES)} (or None), got {amp!r}")


# ---- the loss --------------------------------------------------------------------------------

def default_loss(output, batch=None):
    """The sum of every floating-point tensor in the output, each element weighted by a fixed
    random sign-and-size (the same on every rank). A plain sum would give the layers before a
    LayerNorm or BatchNorm exactly zero gradient, and the doctor would see them as frozen."""
    import torch

    total = None
    for i, t in enumerate(floating_tensors(output)):
        w = torch.randn(t.shape, generator=torch.Generator().manual_seed(i)).to(t.device)
        term = (t.float() * w).sum()
        total = term if total is None else total + term
    if total is None:
        raise DoctorInputError("the module's output holds no floating-point tensor: pass loss_fn")
    return total


class Loss:
    """The loss a rank computes: the user's `loss_fn(output)` or `loss_fn(output, batch)`, or
    the default. Picklable, so it travels to the ranks."""

    def __init__(self, fn: Callable | None = None):
        self.fn = fn
        self.takes_batch = fn is not None and _positional_count(fn) >= 2

    def __call__(self, output, batch):
        if self.fn is None:
            return default_loss(output)
        return self.fn(output, batch) if self.takes_batch else self.fn(output)

    def describe(self, output) -> str:
        if self.fn is not None:
            return ("loss: the loss you gave (loss_fn): outputs it ignores show as parameters "
                    "without gradient")
        n = len(list(floating_tensors(output)))
        return (f"loss: the default, every floating-point tensor of the output ({n} tensor"
                f"{'' if n == 1 else 's'}) weighted by fixed random numbers; an output your "
                "training loss ignores (a pooler, an auxiliary head) counts as used here: pass "
                "loss_fn (--loss) to check with yours")


def _positional_count(fn) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def validate_loss(loss_fn) -> None:
    if loss_fn is not None and not callable(loss_fn):
        raise DoctorInputError(f"loss_fn must be a callable (output) or (output, batch) -> loss, "
                               f"got {type(loss_fn).__name__}")


# ---- checking that the input fits, before any rank starts --------------------------------------

def is_fit_error(exc: BaseException, batch) -> bool:
    import torch

    msg = str(exc)
    if "process group" in msg or "distributed" in msg.lower():
        return False
    if isinstance(exc, TypeError) and re.search(r"positional argument|keyword argument|missing", msg):
        return True
    ints = [t for t in tensors_in(batch) if not t.is_floating_point()]
    if ints and ("dtype" in msg or "scalar type" in msg):
        return True
    return isinstance(exc, (RuntimeError, ValueError, IndexError)) and bool(_FIT.search(msg))


def forward_here(model, batch, amp: str | None):
    """One forward pass in this process, without gradients or warnings."""
    import torch

    with torch.no_grad(), autocast(amp, "cpu"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the ranks report PyTorch's warnings
        return call(model, batch)


def validate_fit(model, batch, name: str, amp: str | None, loss_fn: Callable | None):
    """Run one forward pass here, without gradients; raise DoctorInputError when the input does
    not fit the module (the module's own bugs are left for the ranks to show). Returns the
    output (None when forward raised another error)."""
    try:
        out = forward_here(model, batch, amp)
    except Exception as exc:
        if is_fit_error(exc, batch):
            raise DoctorInputError(f"the input does not fit {name}: {type(exc).__name__}: {exc}\n"
                                   + _last_frames(exc)) from exc
        return None
    if loss_fn is None and not list(floating_tensors(out)):
        raise DoctorInputError(f"{name}'s output ({type(out).__name__}) holds no floating-point "
                               "tensor to build a loss from: pass loss_fn")
    return out
