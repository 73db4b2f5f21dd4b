"""What writes a tensor in place, for a check that watches writes (on_torch_function): the state
check's edits of parameters, the sanity check's first write of a tensor after to_empty. Part of
the floor (context.py); checks import it from api.py."""
from __future__ import annotations

NOT_EDITS = {"requires_grad_", "share_memory_", "retain_grad_", "record_stream_"}


def in_place_functions() -> list:
    """Every in-place Tensor method (`x.add_`, `x[...] = `, `x += `), nn.init's initialisers,
    `x.data = ...` and F.batch_norm (which writes its running statistics)."""
    import torch

    names = [n for n in dir(torch.Tensor) if n.endswith("_") and not n.startswith("_")
             and n not in NOT_EDITS]
    names += ["__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__idiv__"]
    funcs = [getattr(torch.Tensor, n) for n in names if hasattr(torch.Tensor, n)]
    funcs += [getattr(torch.nn.init, n) for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    funcs += [torch.Tensor.data.__set__, torch.nn.functional.batch_norm]
    return funcs


def written_by(func, args, kwargs) -> list:
    """The tensors a call of one of `in_place_functions()` writes."""
    import torch.nn.functional as F

    if func is F.batch_norm:
        training = args[5] if len(args) > 5 else kwargs.get("training", False)
        return [t for t in (args[1:3] if len(args) > 2 else ()) if t is not None] if training else []
    first = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
    return [first] if first is not None else []
