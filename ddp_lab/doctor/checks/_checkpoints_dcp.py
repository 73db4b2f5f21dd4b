"""The checkpoints check on torch.distributed.checkpoint (checkpoints.py): after dcp.save each
rank reads its plain tensors back without a collective; after dcp.load the model must hold the
values it read before it next runs."""
from __future__ import annotations

from ._checkpoints_state import (first_difference, match, plain_module, plain_tensor, same_storage,
                                 tensor_dicts)

KEEP_LOADS = 8  # dcp.load calls kept to check against the model


def flat_plain(obj, prefix=""):
    """{"a.b.c": tensor} for the plain tensors (not DTensors) in nested dicts, as DCP flattens."""
    import torch

    out = {}
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_plain(v, name + "."))
        elif plain_tensor(v):
            out[name] = v
    return out


def probe_of(obj):
    """The same nesting holding a fresh tensor for each plain tensor (what dcp.load fills)."""
    import torch

    out = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            sub = probe_of(v)
            if sub:
                out[k] = sub
        elif plain_tensor(v) and not v.is_meta:
            out[k] = torch.empty_like(v.detach())
    return out


def reader_of(kwargs):
    import torch.distributed.checkpoint as dcp

    writer = kwargs.get("storage_writer")
    if writer is not None and getattr(writer, "path", None) is not None:
        return {"storage_reader": dcp.FileSystemReader(writer.path)}
    if kwargs.get("checkpoint_id") is not None:
        return {"checkpoint_id": kwargs["checkpoint_id"]}
    return None


def check_dcp_save(ctx, load, state_dict, kwargs) -> None:
    """After dcp.save: this rank's plain tensors, read back without a collective."""
    import warnings

    import torch
    from torch.distributed.checkpoint.stateful import Stateful

    where = reader_of(kwargs)
    if where is None or not isinstance(state_dict, dict):
        return
    passed = {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state_dict.items()}
    probe = probe_of(passed)
    if not probe:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(probe, no_dist=True, **where)
    except Exception as exc:  # noqa: BLE001 - e.g. another node's files on its own disk
        ctx.add("dcp-unread", {"where": ctx.user_line(), "why": f"{type(exc).__name__}: {exc}"[:300]})
        return
    mine, read = flat_plain(passed), flat_plain(probe)
    lost = []
    for k, v in mine.items():
        r = read.get(k)
        if r is None or v.shape != r.shape:
            continue
        v = v.detach()
        if not torch.allclose(r.double(), v.double(), rtol=1e-6, atol=1e-9):
            lost.append({"key": k, "off": float((r.double() - v.double()).abs().max())})
    ctx.add("dcp-saves", {"where": ctx.user_line(), "lost": lost[:5], "count": len(lost)})


def note_dcp_load(ctx, state_dict, pending: list) -> None:
    """After dcp.load: keep what it filled, to check against the model before it next runs."""
    if isinstance(state_dict, dict) and len(pending) < KEEP_LOADS:
        pending.append({"where": ctx.user_line(), "state": state_dict, "done": False})


def check_loads(ctx, pending: list, module, when: str) -> None:
    """Does `module` hold the values each pending dcp.load read?"""
    keys = list(module.state_dict().keys())
    live = module.state_dict()
    for p in pending:
        if p["done"]:
            continue
        for _, d in tensor_dicts(p["state"]):
            prefix = match(d, keys)
            if prefix is None:
                continue
            p["done"] = True
            loaded = {k[len(prefix):]: v for k, v in d.items()
                      if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):] in live}
            shared = sum(same_storage(v, live[k]) for k, v in loaded.items())
            diff = None if shared == len(loaded) else first_difference(loaded, live)
            ctx.add("dcp-loads", {"where": p["where"], "when": when, "keys": len(loaded),
                                  "shared": shared, **({"differs": diff[0], "off": diff[1]}
                                                       if diff else {"ok": True})})
            break


def attach_dcp(ctx) -> None:
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_loader as loader
    import torch.distributed.checkpoint.state_dict_saver as saver

    save, load = saver.save, loader.load
    pending: list = []

    def dcp_save(state_dict, *args, **kwargs):
        out = save(state_dict, *args, **kwargs)
        if not ctx.checking:
            ctx.guard(check_dcp_save)(ctx, load, state_dict, kwargs)
        return out

    def dcp_load(state_dict, *args, **kwargs):
        out = load(state_dict, *args, **kwargs)
        if not ctx.checking:
            ctx.guard(note_dcp_load)(ctx, state_dict, pending)
            for w in ctx.models:  # checked when the model next runs
                hook = []
                def before(module, args, hook=hook, w=w):
                    hook[0].remove()
                    ctx.guard(check_loads)(ctx, pending, plain_module(w), "forward")
                hook.append(plain_module(w).register_forward_pre_hook(ctx.user_hook(before, guarded=False)))
        return out

    for owner in (dcp, saver):
        owner.save = dcp_save
    for owner in (dcp, loader):
        owner.load = dcp_load
    ctx.on_model(lambda ctx, w: check_loads(ctx, pending, plain_module(w), "wrapped"))

    def at_finish(ctx):
        for w in ctx.models:
            check_loads(ctx, pending, plain_module(w), "end")
    ctx.on_finish(at_finish)
