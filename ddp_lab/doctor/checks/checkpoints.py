"""Checkpoints the script writes: `torch.save` files reload into a fresh unwrapped model, and
`torch.distributed.checkpoint` (DCP) keeps every rank's values and loads into the model itself.

Rank side (all without a collective: the training group is the user's):
- torch.save / torch.serialization.save: when the object saved holds a state dict of a watched
  model (its keys, maybe under "model"/"state_dict"/..., maybe with a prefix such as DDP's
  "module." or torch.compile's "_orig_mod."), the file is loaded back (torch.load, weights_only
  as torch.load's default) into a copy of the plain module: PyTorch's own load_state_dict message.
- dcp.save: this rank's plain tensors (not DTensors) are read back from the files with
  dcp.load(no_dist=True) and compared with what the rank passed. DCP's planner keeps one copy
  of a key that several ranks save (torch/distributed/checkpoint/_dedup_save_plans.py:42-55,
  called by default_planner.py:135-143): a plain per-rank tensor whose value differs between
  ranks is stored once, the other ranks' values are lost.
- dcp.load: loads in place into the tensors it is given (state_dict_loader.py:87-89: "All
  tensors in state_dict must be allocated on their destination device prior to calling this
  function"); tensors that are copies of the model leave the model unchanged unless the script
  then calls load_state_dict. Checked before the model next runs (its next forward, its wrap,
  or the script's end): the model holds the values dcp.load read, or it does not.
"""
from __future__ import annotations

import os

from ..report import Finding
from . import Check

NAMES = ("module.", "_orig_mod.")  # the prefixes wrappers add (DDP's, torch.compile's)
KEEP_LOADS = 8  # dcp.load calls kept to check against the model


# --- state dicts inside what the script saves ---------------------------------------------------

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
    hits = sum(1 for k in d if isinstance(k, str) and k.startswith(prefix) and k[len(prefix):] in keys)
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
        v, w = local(v).detach(), local(w).detach()
        if v.shape != w.shape:
            return k, float("nan")
        if not torch.equal(v, w.to(v.dtype)):
            return k, float((v.double() - w.double()).abs().max())
    return None


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
    (FSDP2's FSDP<Cls> classes raise in __deepcopy__: fsdp/_fully_shard/_fully_shard.py:294, 299-302)
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


# --- torch.save ---------------------------------------------------------------------------------

def reload_saved(ctx, obj, f) -> None:
    """After torch.save(obj, f): each watched model's state in `obj` reloads from `f`."""
    import torch

    if not isinstance(f, (str, os.PathLike)) or not ctx.models:
        return
    for w in ctx.models:
        plain = plain_module(w)
        keys = list(plain.state_dict().keys())
        for path, d in tensor_dicts(obj):
            prefix = match(d, keys)
            if prefix is None:
                continue
            item = {"where": ctx.user_line(), "file": os.path.basename(str(f)),
                    "kind": w.kind, "prefix": prefix}
            item.update(reload_one(plain, d, path, f, any(is_dtensor(v) for v in d.values())))
            ctx.add("saved", item)
            return


def reload_one(plain, saved: dict, path, f, sharded: bool) -> dict:
    import torch

    try:
        state = at(torch.load(f, map_location="cpu"), path)  # weights_only: torch.load's default
    except Exception as exc:  # noqa: BLE001 - PyTorch's own message is the evidence
        return {"error": f"torch.load: {type(exc).__name__}: {oneline(exc)}",
                "sharded": sharded}
    fresh = fresh_copy(plain)
    try:
        fresh.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {oneline(exc)}", "sharded": sharded}
    if any(same_storage(v, t) for v, t in zip(saved.values(), plain.state_dict().values())):
        diff = first_difference(fresh.state_dict(), plain.state_dict())
        if diff:
            return {"differs": diff[0], "off": diff[1]}
    return {"ok": True}


# --- DCP ----------------------------------------------------------------------------------------

def flat_plain(obj, prefix=""):
    """{"a.b.c": tensor} for the plain tensors (not DTensors) in nested dicts, as DCP flattens."""
    import torch

    out = {}
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat_plain(v, name + "."))
        elif isinstance(v, torch.Tensor) and not is_dtensor(v) and type(v) is torch.Tensor \
                or type(v).__name__ == "Parameter":
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
        elif isinstance(v, torch.Tensor) and not is_dtensor(v) and not v.is_meta:
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load(probe, no_dist=True, **where)
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


# --- attach -------------------------------------------------------------------------------------

def attach(ctx) -> None:
    import torch
    import torch.serialization

    save = torch.serialization.save

    def torch_save(obj, f, *args, **kwargs):
        out = save(obj, f, *args, **kwargs)
        if not ctx.checking:
            ctx.guard(reload_saved)(ctx, obj, f)
        return out

    torch.save = torch_save
    torch.serialization.save = torch_save
    load_state_dict = torch.nn.Module.load_state_dict

    def module_load_state_dict(self, state_dict, *args, **kwargs):
        out = load_state_dict(self, state_dict, *args, **kwargs)
        if not ctx.checking:
            strict = kwargs.get("strict", args[0] if args else True)
            ctx.guard(loaded_nothing)(ctx, self, state_dict, out, strict)
        return out

    torch.nn.Module.load_state_dict = module_load_state_dict
    attach_dcp(ctx)


def loaded_nothing(ctx, module, state_dict, out, strict) -> None:
    """load_state_dict(strict=False) that matched none of the module's keys: it loaded nothing
    and said nothing (torch/nn/modules/module.py:2621-2635: missing and unexpected keys are
    errors only when strict)."""
    if strict or not hasattr(out, "missing_keys") or not len(state_dict):
        return
    own = len(module.state_dict())
    if own and len(out.missing_keys) >= own:
        ctx.add("loaded-nothing", {"where": ctx.user_line(), "type": type(module).__name__,
                                   "missing": len(out.missing_keys),
                                   "unexpected": [str(k) for k in out.unexpected_keys][:4],
                                   "unexpected_count": len(out.unexpected_keys)})


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
                hook.append(plain_module(w).register_forward_pre_hook(before))
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


# --- judge (parent) -----------------------------------------------------------------------------

def _first(ev, key):
    """(rank, item) for each distinct (where, verdict) recorded under `key`, lowest rank first."""
    seen = {}
    for rank, rec in enumerate(ev.ranks):
        for item in rec.get(key, []) or []:
            seen.setdefault(item.get("where", ""), []).append((rank, item))
    return seen


def judge_saves(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "saved").items():
        bad = [(r, i) for r, i in items if not i.get("ok")]
        if not bad:
            continue
        rank, item = bad[0]
        if "error" in item:
            evidence = [f"rank {rank} saved the {item['kind']} model's state to {item['file']}; "
                        f"loading it into a fresh plain model: {item['error']}"]
        else:
            evidence = [f"rank {rank}: {item['differs']} reloads off by {item['off']:.3g} from "
                        "the model's value when it was saved"]
        if item.get("prefix"):
            evidence.append(f"the saved keys start with {item['prefix']!r}, added by "
                            + ("DDP (module.)" if "module." in item["prefix"] else "")
                            + (" and " if "module." in item["prefix"] and "_orig_mod." in item["prefix"] else "")
                            + ("torch.compile (_orig_mod.)" if "_orig_mod." in item["prefix"] else "")
                            if any(n in item["prefix"] for n in NAMES) else
                            f"the saved keys start with {item['prefix']!r}")
        if item.get("sharded"):
            evidence.append("the state holds DTensors: under FSDP2 model.state_dict() is this "
                            "rank's shard of each parameter, not the full value")
        out.append(Finding(
            "error", "checkpoint-does-not-reload", "09",
            "the checkpoint the script saves does not reload into a plain model", evidence,
            fix="save the plain module's state: model.module.state_dict() under DDP, the "
                "module you passed to torch.compile (not its wrapper); under FSDP2 "
                "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                "cpu_offload=True)) on every rank, then save on rank 0",
            where=where))
    return out


WHEN = {"forward": "at the model's next forward", "wrapped": "when the script wrapped the model",
        "end": "when the script ended"}


def judge_dcp(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "dcp-saves").items():
        lost = [(r, i) for r, i in items if i.get("count")]
        if not lost:
            continue
        rank, item = lost[0]
        keys = ", ".join(f"{x['key']} (off by {x['off']:.3g})" for x in item["lost"][:3])
        out.append(Finding(
            "error", "dcp-values-lost", "16",
            "dcp.save kept one rank's value of a tensor that differs between ranks",
            [f"rank {rank} reads back other values than it saved: {keys}",
             "a plain tensor (not a DTensor) under the same key on every rank is taken as "
             "replicated: DCP's planner writes it once (torch/distributed/checkpoint/"
             "_dedup_save_plans.py:42-55, default_planner.py:135-143)"],
            fix="make a per-rank shard a DTensor (DTensor.from_local(shard, mesh, [Shard(0)])) "
                "so that DCP saves each rank's part, or give each rank's tensor its own key",
            where=where))
    for where, items in _first(ev, "dcp-loads").items():
        bad = [(r, i) for r, i in items if "differs" in i]
        if not bad:
            continue
        rank, item = bad[0]
        out.append(Finding(
            "error", "dcp-load-into-copy", "16",
            "dcp.load filled copies of the model's tensors: the model kept its old values",
            [f"rank {rank}: {item['keys'] - item['shared']} of {item['keys']} tensors dcp.load "
             "filled are not the model's own (no shared storage)",
             f"{WHEN.get(item['when'], item['when'])}, the model's {item['differs']} still "
             f"differed from the value dcp.load read by {item['off']:.3g}",
             "dcp.load loads in place into the tensors it is given "
             "(torch/distributed/checkpoint/filesystem.py:914 copies into the tensors it is given)"],
            fix="pass the model's own state (model.state_dict(), or the model itself as a "
                "Stateful), or call model.load_state_dict(state) after dcp.load",
            where=where))
    return out


def judge_loads(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "loaded-nothing").items():
        rank, item = items[0]
        out.append(Finding(
            "error", "checkpoint-does-not-reload", "09",
            "load_state_dict(strict=False) loaded none of the model's tensors", [
                f"rank {rank}: {item['type']}.load_state_dict matched none of its "
                f"{item['missing']} keys; the state's keys were "
                + ", ".join(repr(k) for k in item["unexpected"])
                + (" ..." if item.get("unexpected_count", 0) > len(item["unexpected"]) else ""),
                "strict=False turns the key mismatch PyTorch would raise into a silent no-op: "
                "the model keeps the values it had"],
            fix="pass the model's own state dict (checkpoint['model'], without a 'module.' or "
                "'_orig_mod.' prefix) and load with strict=True, or check the returned "
                "missing_keys", where=where))
    return out


def judge(ev) -> list[Finding]:
    return judge_saves(ev) + judge_loads(ev) + judge_dcp(ev)


CHECK = Check(
    name="checkpoints",
    mechanism="checkpoints the script writes reload into a plain model (torch.save and DCP)",
    lesson="09",
    codes={"checkpoint-does-not-reload": "error", "dcp-values-lost": "error",
           "dcp-load-into-copy": "error"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_checkpoints.py",
    notes=("dcp.async_save is not checked", "a torch.save to a buffer (not a path) is not reloaded",
           "values are compared, not reloaded, for FSDP2's full state dicts"))
