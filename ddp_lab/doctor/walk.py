"""Find what `nn.Module` does not track: tensors kept as plain attributes, sub-modules and
parameters inside plain lists, dicts or tuples, and devices stored as attributes.

`state_dict()`, `.to()`, `parameters()` and DDP's broadcast see only registered parameters,
buffers and sub-modules; everything found here is invisible to all four."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

_DEVICE_STR = re.compile(r"(cuda|mps|xpu|hpu)(:\d+)?")
_CONTAINERS = (list, tuple, dict, set)


@dataclass
class Hidden:
    """An object a module holds that nn.Module does not register."""

    name: str  # e.g. "scale", "blocks.0.mask", "heads[1]", "table['w']"
    kind: str  # "tensor", "parameter", "module", "device"
    container: str  # "attribute", "list", "tuple", "dict", "set"
    value: Any

    @property
    def trainable(self) -> bool:
        if self.kind == "module":
            return any(p.requires_grad for p in self.value.parameters())
        return bool(getattr(self.value, "requires_grad", False))


def _base_attrs() -> frozenset:
    import torch.nn as nn

    return frozenset(vars(nn.Module()))


def _is_torch_class(m) -> bool:
    return type(m).__module__.split(".")[0] == "torch"


def _registered_ids(model) -> set[int]:
    ids = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    return ids | {id(m) for m in model.modules()}


def _classify(value) -> str | None:
    import torch
    import torch.nn as nn

    if isinstance(value, nn.Parameter):
        return "parameter"
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, nn.Module):
        return "module"
    if isinstance(value, torch.device) or (isinstance(value, str) and _DEVICE_STR.fullmatch(value)):
        return "device"
    return None


def _items(value) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        yield from ((f"[{k!r}]", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        yield from ((f"[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, set):
        yield from (("[?]", v) for v in value)


def _scan(name: str, value, container: str, skip: set[int], depth: int) -> Iterator[Hidden]:
    """`container` is the outermost plain container holding `value` ("attribute" if none)."""
    if id(value) in skip:
        return
    kind = _classify(value)
    if kind:
        if kind != "device" or depth == 0:  # a device string deep in a container is just data
            yield Hidden(name, kind, container, value)
        return
    if isinstance(value, _CONTAINERS) and depth < 3:
        outer = type(value).__name__ if depth == 0 else container
        for key, item in _items(value):
            yield from _scan(name + key, item, outer, skip, depth + 1)


def hidden(model) -> list[Hidden]:
    """Everything unregistered that the model's own (non-torch) sub-modules hold."""
    base, skip, found = _base_attrs(), _registered_ids(model), []
    for mod_name, m in model.named_modules():
        if _is_torch_class(m):
            continue
        for attr, value in vars(m).items():
            if attr in base:
                continue
            name = f"{mod_name}.{attr}" if mod_name else attr
            found += list(_scan(name, value, "attribute", skip, 0))
    return found


def hidden_tensors(model) -> dict[str, Any]:
    """Every tensor the model holds but does not register, by name (including the parameters
    and buffers of sub-modules kept in plain containers)."""
    out = {}
    for h in hidden(model):
        if h.kind in ("tensor", "parameter"):
            out[h.name] = h.value
        elif h.kind == "module":
            for n, t in list(h.value.named_parameters()) + list(h.value.named_buffers()):
                out[f"{h.name}.{n}"] = t
    return out


def state_tensors(model) -> dict[str, dict[str, Any]]:
    """All tensor state of the model, by kind: "parameter", "buffer", "unregistered" (trainable
    leaves nn.Module does not see) and "unregistered_state" (the other plain tensors: constants,
    caches, state carried between steps)."""
    plain = hidden_tensors(model)
    trainable = {n: t for n, t in plain.items() if t.requires_grad and t.is_leaf}
    return {"parameter": dict(model.named_parameters()), "buffer": dict(model.named_buffers()),
            "unregistered": trainable,
            "unregistered_state": {n: t for n, t in plain.items() if n not in trainable}}


def graph_holders(model) -> list[str]:
    """Plain tensors the model keeps that still carry an autograd graph (a grad_fn)."""
    return [f"{n} (grad_fn={type(t.grad_fn).__name__})" for n, t in hidden_tensors(model).items()
            if t.grad_fn is not None]
