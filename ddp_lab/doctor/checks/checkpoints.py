"""Checkpoints the script writes: `torch.save` files reload into a fresh unwrapped model, and
`torch.distributed.checkpoint` (DCP) keeps every rank's values and loads into the model itself.

Rank side (all without a collective: the training group is the user's):
- torch.save / torch.serialization.save: when the object saved holds a state dict of a watched
  model (its keys, maybe under "model"/"state_dict"/..., maybe with a prefix such as DDP's
  "module." or torch.compile's "_orig_mod."), the file is loaded back (torch.load, weights_only
  as the script's own torch.load of it, else torch.load's default, and weights_only=False for
  the file the script wrote when the default refuses an object in it) into a copy of the plain
  module: PyTorch's own load_state_dict message.
  A file whose only fault is a wrapper's prefix (it loads once the prefix is off) is a warning,
  named at the wrapper's state_dict() call that gave the keys, and none when the script itself
  loads the file back into that wrapper; shards (FSDP2's model.state_dict()) are an error.
- nn.Module.load_state_dict(strict=False) called from the script that matches none of the
  module's keys: nothing loaded, nothing said.
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
import sys

from ._checkpoints_dcp import attach_dcp
from ._checkpoints_judge import judge
from ._checkpoints_loads import Loads, path_of, reload, watch_state_dicts, wrap_state_dict
from ._checkpoints_restores import Restores
from ._checkpoints_state import (at, first_difference, fresh_copy, is_dtensor, match, oneline,
                                 plain_module, same_storage, tensor_dicts)
from .api import Check


# --- torch.save ---------------------------------------------------------------------------------

RELOADS_PER_LINE = 2  # a save line in the loop (every N steps) is reloaded the first times only


def reload_saved(ctx, obj, f, done: dict, loads: Loads) -> None:
    """After torch.save(obj, f): each watched model's state in `obj` reloads from `f`."""
    if not isinstance(f, (str, os.PathLike)) or not ctx.models:
        return
    where = ctx.user_line()
    if done.get(where, 0) >= RELOADS_PER_LINE:
        return
    for w in ctx.models:
        plain = plain_module(w)
        keys = list(plain.state_dict().keys())
        for path, d in tensor_dicts(obj):
            prefix = match(d, keys)
            if prefix is None:
                continue
            done[where] = done.get(where, 0) + 1
            # a wrapper's prefix comes from the state_dict() call that made the dict: its line
            line = loads.recall(loads.lines, d) if prefix else None
            item = {"where": line or where, "saved_at": where, "file": os.path.basename(str(f)),
                    "path": path_of(f), "kind": w.kind, "prefix": prefix}
            item.update(reload_one(plain, d, path, f, any(is_dtensor(v) for v in d.values()),
                                   prefix, loads))
            ctx.add("saved", item)
            return


def reload_one(plain, saved: dict, path, f, sharded: bool, prefix: str = "", loads=None) -> dict:
    import torch

    try:
        whole, how = reload(loads, f, torch)
        state = at(whole, path)
    except Exception as exc:  # noqa: BLE001 - PyTorch's own message is the evidence
        return {"error": f"torch.load: {type(exc).__name__}: {oneline(exc)}",
                "sharded": sharded}
    fresh = fresh_copy(plain)
    try:
        fresh.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {oneline(exc)}", "sharded": sharded, "how": how,
                "stripped_ok": bool(prefix) and loads_stripped(plain, state, prefix)}
    if any(same_storage(v, t) for v, t in zip(saved.values(), plain.state_dict().values())):
        diff = first_difference(fresh.state_dict(), plain.state_dict())
        if diff:
            return {"differs": diff[0], "off": diff[1], "how": how}
    return {"ok": True, "how": how}


def loads_stripped(plain, state: dict, prefix: str) -> bool:
    """Whether the state loads once the wrapper's prefix is taken off its keys (then the file
    holds the whole model, under the names only the same wrapper reloads)."""
    try:
        fresh_copy(plain).load_state_dict(
            {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        return True
    except Exception:  # noqa: BLE001
        return False


# --- attach -------------------------------------------------------------------------------------

def attach(ctx) -> None:
    import torch
    import torch.serialization

    save, load = torch.serialization.save, torch.serialization.load
    done: dict = {}
    loads = Loads(ctx)
    restores = Restores(ctx, loads)
    wrap_state_dict(ctx, loads, restores.took)
    ctx.on_step_end(restores.step_end)

    def torch_save(obj, f, *args, **kwargs):
        out = save(obj, f, *args, **kwargs)
        if not ctx.checking:
            ctx.guard(reload_saved)(ctx, obj, f, done, loads)
        return out

    def torch_load(f, *args, **kwargs):
        out = load(f, *args, **kwargs)
        if not ctx.checking:
            ctx.guard(loads.loaded)(out, f, kwargs, sys._getframe(1))
            where = ctx.user_line(sys._getframe(1))  # (the resume check's wrapper may be between)
            if where:
                ctx.guard(restores.read)(out, where)
        return out

    torch.save = torch.serialization.save = torch_save
    torch.load = torch.serialization.load = torch_load
    load_state_dict = torch.nn.Module.load_state_dict

    def module_load_state_dict(self, state_dict, *args, **kwargs):
        mine = not ctx.checking and ctx.is_user_file(sys._getframe(1).f_code.co_filename)
        if mine:
            ctx.guard(restores.loading)(self, state_dict)
        out = load_state_dict(self, state_dict, *args, **kwargs)
        if mine:
            strict = kwargs.get("strict", args[0] if args else True)
            ctx.guard(loaded_nothing)(ctx, self, state_dict, out, strict)
            ctx.guard(loaded_into)(ctx, loads, self, state_dict, strict)
        return out

    torch.nn.Module.load_state_dict = module_load_state_dict
    ctx.on_model(lambda ctx, w: watch_state_dicts(ctx, loads, w))
    attach_dcp(ctx)


def loaded_into(ctx, loads: Loads, module, state_dict, strict) -> None:
    """A strict load_state_dict from the user's code that loaded a file: into a wrapper (its
    own prefixed keys) or a plain module. A file only the same wrapper reloads is right when
    that is how the script reloads it."""
    path = loads.recall(loads.origins, state_dict)
    if path is not None and strict:
        wrapper = any(w.wrapper is module and w.kind in ("ddp", "compiled") for w in ctx.models)
        ctx.add("reloaded", {"path": path, "where": ctx.user_line(), "into": "wrapper" if wrapper else "module"})


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


CHECK = Check(
    name="checkpoints",
    mechanism="checkpoints the script writes reload into a plain model, read as the script "
              "reads them (torch.save and DCP); a module is restored from the state meant for "
              "it (not its own live tensors, not another module's over the checkpoint's)",
    lesson="09",
    codes={"checkpoint-does-not-reload": "error", "dcp-values-lost": "error",
           "dcp-load-into-copy": "error", "state-dict-by-reference": "warning",
           "checkpoint-state-not-restored": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_checkpoints.py",
    notes=("dcp.async_save is not checked", "a torch.save to a buffer (not a path) is not reloaded",
           "a torch.save line is reloaded its first 2 times only",
           "a saved state whose tensors are not the model's own (an EMA, a snapshot) is reloaded, "
           "its values are not compared with the model's",
           "load_state_dict(strict=False) is judged only when the script calls it itself",
           "a file with a wrapper's prefix is right when the script loads it back into that "
           "wrapper in the same run; a reload uses the script's own torch.load arguments, else "
           "weights_only=False for a file the default refuses (the script wrote it)"))
