"""Every tensor a module holds, registered or not: what `parameters()` and `buffers()` see, and
what they miss (plain tensor attributes, tensors and sub-modules kept in plain lists or dicts).

DDP, `module.to()` and `state_dict()` only know the registered ones; this walker finds the rest,
so a rank can measure them too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# How a tensor is held by its module, from "fully known to PyTorch" to "invisible to it".
PARAMETER = "parameter"
BUFFER = "buffer"
BUFFER_NOT_SAVED = "buffer (persistent=False)"
PLAIN_ATTRIBUTE = "plain tensor attribute"
PLAIN_CONTAINER = "inside a plain list/dict"
REGISTERED = (PARAMETER, BUFFER, BUFFER_NOT_SAVED)
_INTERNAL = frozenset(vars(nn.Module()))  # nn.Module's own bookkeeping (_parameters, hooks, ...)


@dataclass(frozen=True)
class Held:
    """One tensor of a module: its dotted name, how it is held, and the tensor itself."""

    name: str
    how: str
    tensor: torch.Tensor

    @property
    def registered(self) -> bool:
        return self.how in REGISTERED


def find_tensors(module: nn.Module) -> dict[str, Held]:
    """Every tensor reachable from `module`'s attributes, by name ("blocks[0].weight")."""
    found: dict[str, Held] = {}
    _walk(module, "", True, found, set())
    return found


def _walk(module: nn.Module, prefix: str, registered: bool, found: dict, seen: set) -> None:
    if id(module) in seen:  # a module reachable twice (shared, or a back-reference)
        return
    seen.add(id(module))
    for name, p in module._parameters.items():
        if p is not None:
            how = PARAMETER if registered else PLAIN_CONTAINER
            found[prefix + name] = Held(prefix + name, how, p)
    for name, b in module._buffers.items():
        if b is not None:
            how = BUFFER_NOT_SAVED if name in module._non_persistent_buffers_set else BUFFER
            found[prefix + name] = Held(prefix + name, how if registered else PLAIN_CONTAINER, b)
    for name, child in module._modules.items():
        if child is not None:
            _walk(child, f"{prefix}{name}.", registered, found, seen)
    for name, value in vars(module).items():
        if name not in _INTERNAL:
            _walk_value(value, prefix + name, registered, found, seen, top=True)


def _walk_value(value, name: str, registered: bool, found: dict, seen: set,
                top: bool = False) -> None:
    if isinstance(value, torch.Tensor):
        how = PLAIN_ATTRIBUTE if top and registered else PLAIN_CONTAINER
        found[name] = Held(name, how, value)
    elif isinstance(value, nn.Module):
        _walk(value, name + ".", False, found, seen)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk_value(item, f"{name}[{i}]", registered, found, seen)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk_value(item, f"{name}[{key!r}]", registered, found, seen)


def trainable(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the module's author meant to train (requires_grad), registered or not."""
    return {n: h.tensor for n, h in find_tensors(module).items() if h.tensor.requires_grad}


def unregistered(module: nn.Module) -> list[str]:
    """Names of the tensors that `parameters()`, `buffers()`, `.to()`, DDP and `state_dict()`
    all miss."""
    return [n for n, h in find_tensors(module).items() if not h.registered]


def table(module: nn.Module) -> list[dict]:
    """Plain rows (name, how, registered, device, dtype, shape) for printing or plotting."""
    return [{"name": n, "how": h.how, "registered": h.registered, "device": str(h.tensor.device),
             "dtype": str(h.tensor.dtype).replace("torch.", ""), "shape": tuple(h.tensor.shape)}
            for n, h in find_tensors(module).items()]


def format_table(rows: list[dict]) -> str:
    """`table(module)` as aligned text, one tensor a line."""
    width = max((len(r["name"]) for r in rows), default=4)
    lines = [f"{'tensor':<{width}}  {'held as':<26} {'device':<7} dtype"]
    for r in rows:
        lines.append(f"{r['name']:<{width}}  {r['how']:<26} {r['device']:<7} {r['dtype']}")
    return "\n".join(lines)
