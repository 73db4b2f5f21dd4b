"""The checkpoints check's state-dict helpers (checkpoints.py): find a watched model's state
inside what the script saves or loads (maybe under "model", maybe with a wrapper's prefix),
compare values without a collective (a DTensor by its local shard), and make a fresh plain
module of the model's structure to reload into."""
from __future__ import annotations


def plain_module(w):
    """The innermost plain nn.Module of a watched model (under DDP(compile(m)): m)."""
    m = w.module
    for _ in range(4):
        inner = getattr(m, "_orig_mod", None) or (m.module if type(m).__name__ ==
                                                  "DistributedDataParallel" else None)
        if inner is None:
            break
        m = inner
    return m


def tensor_dicts(obj, path=(), depth=0):
    """(path, dict) for every dict inside `obj` (nested dicts, lists) holding tensors by str key."""
    import torch

    if depth > 4:
        return
    if isinstance(obj, dict):
        if any(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            yield path, obj
        for k, v in obj.items():
            if isinstance(v, (dict, list, tuple)):
                yield from tensor_dicts(v, path + (k,), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensor_dicts(v, path + (i,), depth + 1)


def match(d: dict, keys) -> str | None:
    """The prefix that maps `d`'s keys onto the model's `keys` (""), when at least half of the
    model's keys are there with that one prefix; None when `d` is not this model's state."""
    keys = set(keys)
    if not keys:
        return None
    prefix = None
    for k in d:
        if not isinstance(k, str):
            continue
        for mk in keys:
            if k.endswith(mk) and (len(k) == len(mk) or k[-len(mk) - 1] == "."):
                prefix = k[: len(k) - len(mk)]
                break
        if prefix is not None:
            break
    if prefix is None:
        return None
    hits = sum(1 for k in d
               if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):] in keys)
    return prefix if hits >= max(1, len(keys) // 2) else None


def oneline(exc, limit: int = 500) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + " ..."


def at(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor"


def local(t):
    return t.to_local() if is_dtensor(t) else t


def first_difference(a: dict, b: dict):
    """(key, max |a - b|) for the first tensor of `a` that differs from `b`'s, else None."""
    import torch

    for k, v in a.items():
        w = b.get(k)
        if not isinstance(v, torch.Tensor) or not isinstance(w, torch.Tensor):
            continue
        v, w = as_local(v, w), as_local(w, v)
        if v.shape != w.shape:
            return k, float("nan")
        if not torch.equal(v, w.to(v.dtype)):
            return k, float((v.double() - w.double()).abs().max())
    return None


def as_local(t, other):
    """`t` as this rank holds it: a DTensor's local shard; a full plain tensor compared with a
    DTensor, the same slice of it (torch/distributed/tensor/_utils.py:93,
    compute_local_shape_and_global_offset: no collective)."""
    if is_dtensor(t):
        return t.to_local().detach()
    if is_dtensor(other) and tuple(t.shape) == tuple(other.shape):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            other.shape, other.device_mesh, other.placements)
        return t.detach()[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
    return t.detach()


def same_storage(a, b) -> bool:
    try:
        return local(a).untyped_storage().data_ptr() == local(b).untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, fake)
        return False


HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
         "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called", "_backward_hooks",
         "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
         "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def fresh_copy(module):
    """A new plain module of the same structure: a deepcopy, or where the module refuses one
    (FSDP2's FSDP<Cls> classes raise in __deepcopy__:
    torch/distributed/fsdp/_fully_shard/_fully_shard.py:294, 299-302)
    a skeleton of the original classes with empty plain tensors of the full shapes."""
    import copy

    if not any(is_dtensor(t) for t in module.state_dict().values()):
        return copy.deepcopy(module)
    return skeleton(module)


def skeleton(m):
    import torch

    cls = type(m)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2:
        cls = cls.__bases__[1]  # fully_shard made FSDP<Cls>(FSDPModule, Cls)
    new = cls.__new__(cls)
    state = dict(m.__dict__)
    for name in HOOKS:
        if name in state:
            state[name] = type(state[name])()
    state["_parameters"] = {k: None if p is None else torch.nn.Parameter(
        torch.empty(p.shape, dtype=p.dtype), p.requires_grad) for k, p in m._parameters.items()}
    state["_buffers"] = {k: None if b is None else torch.empty(b.shape, dtype=b.dtype)
                         for k, b in m._buffers.items()}
    state["_modules"] = {k: None if c is None else skeleton(c) for k, c in m._modules.items()}
    new.__dict__.update(state)
    return new


def plain_tensor(v) -> bool:
    """A plain tensor or parameter: not a DTensor or another tensor subclass."""
    import torch

    return type(v) in (torch.Tensor, torch.nn.Parameter)
