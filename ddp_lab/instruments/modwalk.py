"""Walking an `nn.Module` for what it holds, registered or not: the one walker lesson 01's
inventory and the doctor both use.

`parameters()`, `buffers()`, `.to()`, `state_dict()` and DDP's broadcast see only registered
parameters, buffers and sub-modules. `find_tensors` lists every tensor a module holds and how it
is held; `hidden` lists the objects nn.Module does not register (tensors kept as plain
attributes, sub-modules and parameters in plain lists, dicts, tuples or sets, devices stored as
attributes). Both read attributes through `_scan`, so they agree on what "held" means."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

# How a tensor is held by its module, from "fully known to PyTorch" to "invisible to it".
PARAMETER = "parameter"
BUFFER = "buffer"
BUFFER_NOT_SAVED = "buffer (persistent=False)"
PLAIN_ATTRIBUTE = "plain tensor attribute"
PLAIN_CONTAINER = "inside a plain list/dict"
REGISTERED = (PARAMETER, BUFFER, BUFFER_NOT_SAVED)

_DEVICE_STR = re.compile(r"(cuda|mps|xpu|hpu)(:\d+)?")
_CONTAINERS = (list, tuple, dict, set)
MAX_DEPTH = 3  # containers nested deeper than this are data, not structure


def base_attrs() -> frozenset:
    """nn.Module's own bookkeeping attributes (_parameters, hooks, training, ...)."""
    import torch.nn as nn

    return frozenset(vars(nn.Module()))


def is_torch_class(m) -> bool:
    return type(m).__module__.split(".")[0] == "torch"


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


def _scan(name: str, value, container: str = "attribute", skip: frozenset | set = frozenset(),
          depth: int = 0) -> Iterator[tuple[str, str, str, Any]]:
    """(name, kind, container, value) of every tensor, module or device reachable from one
    attribute; `container` is the outermost plain container ("attribute" if none)."""
    if id(value) in skip:
        return
    kind = _classify(value)
    if kind:
        if kind != "device" or depth == 0:  # a device string deep in a container is just data
            yield name, kind, container, value
        return
    if isinstance(value, _CONTAINERS) and depth < MAX_DEPTH:
        outer = type(value).__name__ if depth == 0 else container
        for key, item in _items(value):
            yield from _scan(name + key, item, outer, skip, depth + 1)


def _own_attributes(module, base: frozenset) -> Iterator[tuple[str, Any]]:
    return ((a, v) for a, v in vars(module).items() if a not in base)


# ---- every tensor, and how it is held (lesson 01's inventory) --------------------------------

@dataclass(frozen=True)
class Held:
    """One tensor of a module: its dotted name, how it is held, and the tensor itself."""

    name: str
    how: str
    tensor: Any

    @property
    def registered(self) -> bool:
        return self.how in REGISTERED


def find_tensors(module) -> dict[str, Held]:
    """Every tensor reachable from `module`'s attributes, by name ("blocks[0].weight")."""
    found: dict[str, Held] = {}
    _walk(module, "", True, found, set(), base_attrs())
    return found


def _walk(module, prefix: str, registered: bool, found: dict, seen: set, base) -> None:
    if id(module) in seen:  # a module reachable twice (shared, or a back-reference)
        return
    seen.add(id(module))
    for name, p in module._parameters.items():
        if p is not None:
            found[prefix + name] = Held(prefix + name, PARAMETER if registered else PLAIN_CONTAINER, p)
    for name, b in module._buffers.items():
        if b is not None:
            how = BUFFER_NOT_SAVED if name in module._non_persistent_buffers_set else BUFFER
            found[prefix + name] = Held(prefix + name, how if registered else PLAIN_CONTAINER, b)
    for name, child in module._modules.items():
        if child is not None:
            _walk(child, f"{prefix}{name}.", registered, found, seen, base)
    for attr, value in _own_attributes(module, base):
        for name, kind, container, obj in _scan(prefix + attr, value):
            if kind == "module":
                _walk(obj, name + ".", False, found, seen, base)
            elif kind in ("tensor", "parameter"):
                top = container == "attribute" and registered
                found[name] = Held(name, PLAIN_ATTRIBUTE if top else PLAIN_CONTAINER, obj)


def trainable(module) -> dict[str, Any]:
    """Every tensor the module's author meant to train (requires_grad), registered or not."""
    return {n: h.tensor for n, h in find_tensors(module).items() if h.tensor.requires_grad}


def unregistered(module) -> list[str]:
    """Names of the tensors that `parameters()`, `buffers()`, `.to()`, DDP and `state_dict()`
    all miss."""
    return [n for n, h in find_tensors(module).items() if not h.registered]


def table(module) -> list[dict]:
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


# ---- what nn.Module does not register (the doctor's static checks) ---------------------------

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


def _registered_ids(model) -> set[int]:
    ids = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    return ids | {id(m) for m in model.modules()}


def hidden(model) -> list[Hidden]:
    """Everything unregistered that the model's own (non-torch) sub-modules hold."""
    base, skip, found = base_attrs(), _registered_ids(model), []
    for mod_name, m in model.named_modules():
        if is_torch_class(m):
            continue
        for attr, value in _own_attributes(m, base):
            name = f"{mod_name}.{attr}" if mod_name else attr
            found += [Hidden(*item) for item in _scan(name, value, "attribute", skip)]
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
    trainable_ = {n: t for n, t in plain.items() if t.requires_grad and t.is_leaf}
    return {"parameter": dict(model.named_parameters()), "buffer": dict(model.named_buffers()),
            "unregistered": trainable_,
            "unregistered_state": {n: t for n, t in plain.items() if n not in trainable_}}


def graph_holders(model) -> list[str]:
    """Plain tensors the model keeps that still carry an autograd graph (a grad_fn)."""
    return [f"{n} (grad_fn={type(t.grad_fn).__name__})" for n, t in hidden_tensors(model).items()
            if t.grad_fn is not None]
