"""The resume check's reading of what the script saves and loads (resume.py): which optimizer's
state a torch.save holds, and whether it holds the live LR schedulers and GradScalers that step
with that optimizer; where a loaded state came from (its file); and the digests that compare the
state a rank resumes from with the other ranks'."""
from __future__ import annotations

import os
import zlib
from collections import OrderedDict

from .api import digest

DEPTH = 5  # how deep into nested dicts and lists a saved or loaded object is read
ITEMS = 10_000  # how many of its objects (a list of a million numbers is not a checkpoint's state)
ORIGINS_KEPT = 20_000  # ids of loaded dicts remembered (the newest)


def walk(obj, depth=0):
    """Every object inside `obj` (dict values, list items), `obj` first."""
    yield obj
    if depth >= DEPTH:
        return
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for v in items:
        yield from walk(v, depth + 1)


def contents(obj) -> list:
    """`obj` and what it holds (walk), the first ITEMS."""
    from itertools import islice

    return list(islice(walk(obj), ITEMS))


def is_optimizer_state(d) -> bool:
    """An Optimizer.state_dict() (torch/optim/optimizer.py:681: {"state", "param_groups"})."""
    return (isinstance(d, dict) and "state" in d and isinstance(d.get("param_groups"), list)
            and all(isinstance(g, dict) and "params" in g for g in d["param_groups"]))


def is_scheduler_state(d) -> bool:
    """An LRScheduler.state_dict(): its __dict__ without the optimizer
    (torch/optim/lr_scheduler.py:182-190), so "last_epoch" and "_last_lr" among its keys."""
    return isinstance(d, dict) and "last_epoch" in d and ("_last_lr" in d or "base_lrs" in d)


def is_scaler_state(d) -> bool:
    """A GradScaler.state_dict() (torch/amp/grad_scaler.py:627-652)."""
    return isinstance(d, dict) and "scale" in d and "_growth_tracker" in d


def holds_optimizer(saved: list, opt) -> bool:
    """Whether one of the saved optimizer states is `opt`'s: state_dict() keeps each parameter's
    state dict itself (optimizer.py:757-760); without state on either side (SGD without
    momentum), the same groups with the same lr."""
    own = {id(v) for v in opt.state.values()}
    groups = [(len(g["params"]), g.get("lr")) for g in opt.param_groups]
    for d in saved:
        if own and any(id(v) in own for v in d["state"].values()):
            return True
        if not own and not d["state"] and \
                [(len(g["params"]), g.get("lr")) for g in d["param_groups"]] == groups:
            return True
    return False


def lrs(values) -> list:
    return [float(v) for v in values]


def parts_of(rank, found: list, opt, info: dict) -> list:
    """The schedulers and enabled GradScalers that step with `opt`, each held in the save or not."""
    from torch.optim.lr_scheduler import LRScheduler

    out = []
    members = {id(m) for s in rank.schedulers for m in getattr(s, "_schedulers", ())}
    for s, sinfo in list(rank.schedulers.items()):
        if getattr(s, "optimizer", None) is not opt or id(s) in members:
            continue
        held = any(x is s for x in found) or any(
            is_scheduler_state(x) and x["last_epoch"] == s.last_epoch for x in found
            if not isinstance(x, LRScheduler))
        out.append({"what": "scheduler", "cls": type(s).__name__, "line": sinfo["line"],
                    "held": held, "pos": s.last_epoch, "lr": lrs(s.get_last_lr()),
                    "optimizer": info["ord"]})
    for sc, scinfo in list(rank.scalers.items()):
        if opt not in scinfo["stepped"] or not sc.is_enabled():
            continue
        scale = sc.get_scale()
        held = any(x is sc for x in found) or any(
            is_scaler_state(x) and float(x["scale"]) == scale for x in found)
        out.append({"what": "scaler", "cls": type(sc).__name__, "line": scinfo["line"],
                    "held": held, "scale": scale, "optimizer": info["ord"]})
    return out


def states_held(found: list) -> list:
    """The scheduler and scaler states a save holds (objects or state dicts), by position."""
    from torch.amp import GradScaler
    from torch.optim.lr_scheduler import LRScheduler

    out = []
    for x in found:
        if isinstance(x, LRScheduler) or is_scheduler_state(x):
            out.append({"what": "scheduler", "pos": getattr(x, "last_epoch", None)
                        if isinstance(x, LRScheduler) else x["last_epoch"]})
        elif isinstance(x, GradScaler) or is_scaler_state(x):
            out.append({"what": "scaler", "scale": x.get_scale() if isinstance(x, GradScaler)
                        else float(x["scale"])})
    return out


def path_of(f) -> str | None:
    return os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None


class Origins:
    """Which file each dict torch.load returned (and each dict inside it) came from, by id,
    without holding the objects (a checkpoint can be as large as the model)."""

    def __init__(self):
        self.ids: OrderedDict = OrderedDict()

    def remember(self, obj, path: str) -> None:
        for x in contents(obj):
            if isinstance(x, dict):
                self.ids[id(x)] = (path, len(x))
        while len(self.ids) > ORIGINS_KEPT:
            self.ids.popitem(last=False)

    def file_of(self, obj) -> str | None:
        found = self.ids.get(id(obj))
        return found[0] if found and isinstance(obj, dict) and found[1] == len(obj) else None


def state_digests(ctx, opt) -> dict | None:
    """{"model", "optimizer", "n", "names"}: digests of `opt`'s parameters that a DDP model holds
    (every rank holds the same values: DDP broadcast them in its constructor), of their optimizer
    state and of their names (a sharded optimizer, ZeroRedundancyOptimizer's, steps other
    parameters on each rank); None when it steps none of a DDP model's parameters (FSDP2's shards
    differ by design)."""
    import torch

    names = {id(p): n for w in ctx.models if w.kind == "ddp" for n, p in w.module.named_parameters()}
    params = [p for g in opt.param_groups for p in g["params"] if id(p) in names]
    if not params:
        return None
    model, state = zlib.crc32(b""), zlib.crc32(b"")
    held = zlib.crc32(";".join(names[id(p)] for p in params).encode())
    for p in params:
        model = zlib.crc32(digest(p).encode(), model)
        for k, v in sorted(opt.state.get(p, {}).items(), key=lambda kv: str(kv[0])):
            text = digest(v) if isinstance(v, torch.Tensor) else repr(v)
            state = zlib.crc32(f"{k}={text};".encode(), state)
    return {"model": f"{model:08x}", "optimizer": f"{state:08x}", "n": len(params),
            "names": f"{held:08x}"}
