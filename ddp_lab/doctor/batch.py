"""Tensors nested in tuples, lists and dicts (a batch, an output), for every tool of the wing:
a tuple is forward's positional arguments, a dict its keyword arguments."""
from __future__ import annotations


def tensors_in(value):
    """Every tensor in `value`, depth first: a tensor, or tuples, lists and dicts of them."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors_in(v)


def map_tensors(value, fn):
    """`value` with every tensor `t` in it replaced by `fn(t)`; the tuples, lists and dicts
    around them rebuilt, anything else kept."""
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def floating_tensors(value):
    """Every floating-point tensor in `value` (see tensors_in)."""
    return (t for t in tensors_in(value) if t.is_floating_point())


def move(batch, dev):
    return map_tensors(batch, lambda t: t.to(dev))


def call(model, batch):
    """A tuple is the positional arguments of forward, a dict its keyword arguments."""
    if isinstance(batch, tuple):
        return model(*batch)
    if isinstance(batch, dict):
        return model(**batch)
    return model(batch)
