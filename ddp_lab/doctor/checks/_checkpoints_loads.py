"""The checkpoints check's view of how the script reads its checkpoints back (checkpoints.py), so
that the check reloads a file as the script would and knows what the script itself does with it:

- torch.load from the user's code: the file and the arguments (weights_only);
- which file each dict torch.load returned came from (by id, without holding the objects), so
  that a module.load_state_dict(state) from the user's code names the file it loads;
- the lines where the script calls state_dict() on a wrapper (DDP, torch.compile's module): the
  line whose keys carry the wrapper's prefix ("module.", "_orig_mod."), patched in only once the
  script wraps a model.
"""
from __future__ import annotations

import os
import pickle
import sys
from collections import OrderedDict

KEPT = 20_000  # ids remembered (the newest)
REFUSED = "Weights only load failed"  # torch/serialization.py: torch.load's weights_only refusal


def path_of(f) -> str | None:
    return os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None


class Loads:
    def __init__(self, ctx):
        self.ctx = ctx
        self.calls: list = []  # {file, where, weights_only} per torch.load of the user's
        self.origins: OrderedDict = OrderedDict()  # id(dict) -> (file, len)
        self.lines: OrderedDict = OrderedDict()  # id(state dict) -> (line, len)
        self.wrappers: set = set()  # ids of the wrappers whose state_dict() lines are kept

    def remember(self, table: OrderedDict, obj, value) -> None:
        table[id(obj)] = (value, len(obj))
        while len(table) > KEPT:
            table.popitem(last=False)

    def recall(self, table: OrderedDict, obj):
        found = table.get(id(obj))
        return found[0] if found and isinstance(obj, dict) and found[1] == len(obj) else None

    def loaded(self, out, f, kwargs, frame) -> None:
        path = path_of(f)
        if path is None:
            return
        todo = [(out, 0)]
        while todo:
            obj, depth = todo.pop()
            if isinstance(obj, dict):
                self.remember(self.origins, obj, path)
                todo += [(v, depth + 1) for v in obj.values() if depth < 4]
        where = self.ctx.user_line(frame)
        if where:
            self.calls.append({"file": path, "where": where,
                               "weights_only": kwargs.get("weights_only")})

    def script_kwargs(self, path: str | None) -> tuple[dict, str]:
        """torch.load's keyword arguments as the script's own load of `path` (or, not yet seen,
        its last load of any file) gave them, and where."""
        mine = [c for c in self.calls if c["file"] == path] or self.calls
        for c in reversed(mine):
            if c["weights_only"] is not None:
                return {"weights_only": c["weights_only"]}, c["where"]
        return {}, ""


def reload(loads: Loads, f, torch) -> tuple[object, str]:
    """torch.load(f) as the script would: its own arguments, else torch.load's default; a file
    the script wrote itself that the default refuses (weights_only=True refuses any object but
    tensors and plain containers) again with weights_only=False. (the object, how it was read)"""
    kwargs, where = loads.script_kwargs(path_of(f))
    how = (f"weights_only={kwargs['weights_only']}, as the script's own torch.load ({where})"
           if kwargs else "torch.load's default (weights_only=True)")
    try:
        return torch.load(f, map_location="cpu", **kwargs), how
    except pickle.UnpicklingError as exc:
        if REFUSED not in str(exc) or kwargs.get("weights_only") is not None:
            raise
    return (torch.load(f, map_location="cpu", weights_only=False),
            "weights_only=False: torch.load's default refuses an object the file holds, and the "
            "script wrote this file itself")


def watch_state_dicts(ctx, loads: Loads, w) -> None:
    """On a wrapper's wrap: its top-level state_dict() calls from now on remember their line."""
    if w.kind in ("ddp", "compiled"):
        loads.wrappers.add(id(w.wrapper))


def wrap_state_dict(ctx, loads: Loads, took) -> None:
    """nn.Module.state_dict wrapped once: each top-level call from the user's code is passed to
    `took(module, out, its line)`; a wrapper's (watch_state_dicts) also remembers its line."""
    import torch

    if getattr(torch.nn.Module.state_dict, "_watched", False):
        return
    state_dict = torch.nn.Module.state_dict

    def watched(self, *args, **kwargs):
        out = state_dict(self, *args, **kwargs)
        if not args and not kwargs.get("prefix") and not ctx.checking \
                and ctx.is_user_file(sys._getframe(1).f_code.co_filename):
            where = ctx.user_line(sys._getframe(1))
            ctx.guard(took)(self, out, where)
            if id(self) in loads.wrappers and isinstance(out, dict):
                loads.remember(loads.lines, out, where)
        return out

    watched._watched = True
    torch.nn.Module.state_dict = watched
