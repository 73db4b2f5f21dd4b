"""What a module is restored from (checkpoints.py): the state the script meant, or another.

`state_dict()` returns the module's live tensors, not copies (torch/nn/modules/module.py,
`_save_to_state_dict`: `destination[prefix + name] = param if keep_vars else param.detach()`,
a view of the same storage). Two ways a restore takes other values than the script meant:

- **restores nothing**: `load_state_dict(state)` where `state`'s tensors are the module's own,
  taken by an earlier step's `state_dict()` (a "best" state kept as `model.state_dict()`): it
  has followed every update since, and loading it copies the module onto itself. Recorded with
  the line that took it and its step ("restores", kind "itself").
- **restored from a live module, not the checkpoint read**: after the script read a checkpoint
  (torch.load), `load_state_dict` into a module from another module's live `state_dict()`,
  while the file holds an entry with exactly that module's keys that nothing has loaded by the
  end of the next step (an EMA reset from the model's weights on resume, its saved state left
  unread). ("restores", kind "live").

Only calls from the user's code; a state taken and loaded in the same step is not judged (the
module has not changed since).
"""
from __future__ import annotations

from collections import OrderedDict

from ._checkpoints_state import same_storage, tensor_dicts
from .api import Finding


class Restores:
    def __init__(self, ctx, loads):
        self.ctx, self.loads = ctx, loads  # loads: _checkpoints_loads.Loads (its id tables)
        self.taken: OrderedDict = OrderedDict()  # id(state) -> ((line, step, id(module)), len)
        self.entries: list = []  # per file entry torch.load returned: {id, keys, path, where, used}
        self.pending: list = []  # loads from a live state after a checkpoint was read

    def took(self, module, out, where: str) -> None:
        """A top-level state_dict() from the user's code (at `where`) returned `out`."""
        if isinstance(out, dict) and out:
            self.loads.remember(self.taken, out, (where, self.ctx.step, id(module)))

    def read(self, out, where: str) -> None:
        """torch.load from the user's code returned `out`: its state-dict-like entries."""
        for path, d in tensor_dicts(out):
            self.entries.append({"id": id(d), "keys": frozenset(k for k in d if isinstance(k, str)),
                                 "path": "".join(f"[{p!r}]" for p in path), "where": where,
                                 "used": False})
        del self.entries[:-64]

    def loading(self, module, state) -> None:
        """`module.load_state_dict(state)` from the user's code, before it runs."""
        for e in self.entries:
            if e["id"] == id(state):
                e["used"] = True
        found = self.loads.recall(self.taken, state)
        if found is None:
            return
        line, step, source = found
        own = module.state_dict()
        common = [k for k in state if k in own]
        if common and all(same_storage(state[k], own[k]) for k in common):
            if step < self.ctx.step:
                self.ctx.add("restores", {"kind": "itself", "where": line, "loaded_at": self.ctx.user_line(),
                                          "taken": step, "s": self.ctx.step,
                                          "type": type(module).__name__})
            return
        if self.entries and source != id(module) and step == self.ctx.step:
            # another module's live state (taken this step), after a checkpoint was read
            self.pending.append({"keys": frozenset(own), "where": line, "loaded_at": self.ctx.user_line(),
                                 "s": self.ctx.step, "type": type(module).__name__,
                                 "entries": list(self.entries)})  # the files read before it

    def step_end(self, ctx) -> None:
        """Each pending load, a step later: a file entry with the module's keys nothing loaded."""
        keep = []
        for p in self.pending:
            if ctx.step <= p["s"]:
                keep.append(p)
                continue
            unread = [e for e in p["entries"] if e["keys"] == p["keys"] and not e["used"]]
            if unread:
                e = unread[0]
                ctx.add("restores", {"kind": "live", "where": p["where"], "loaded_at": p["loaded_at"], "s": p["s"],
                                     "type": p["type"], "entry": e["path"], "read_at": e["where"]})
        self.pending = keep


def judge_restores(ev) -> list:
    out, seen = [], set()
    for rank, rec in enumerate(ev.ranks):
        for item in rec.get("restores", []) or []:
            if (item["kind"], item["where"]) in seen:
                continue
            seen.add((item["kind"], item["where"]))
            if item["kind"] == "itself":
                evidence = [f"rank {rank}: {item['type']}.load_state_dict at step {item['s']} "
                            f"({item['loaded_at']}) loads the tensors this state_dict() returned "
                            f"at step {item['taken']}: they are the module's own, not a copy",
                            "state_dict() returns the live tensors (detached views of the same "
                            "storage): every update since changed them, and the load copies the "
                            "module onto itself"]
                out.append(Finding(
                    "warning", "state-dict-by-reference", "09",
                    "a state kept from an earlier step restores nothing: state_dict() holds the "
                    "live tensors", evidence,
                    fix="keep a copy: copy.deepcopy(model.state_dict()), or "
                        "{k: v.detach().clone() for k, v in model.state_dict().items()}",
                    where=item["where"]))
            else:
                evidence = [f"rank {rank}: {item['type']}.load_state_dict at step {item['s']} "
                            f"({item['loaded_at']}) loads the live state_dict() this line takes "
                            "of another module",
                            f"the checkpoint read at {item['read_at']} holds a state with exactly "
                            f"this module's keys at {item['entry']}, which nothing loaded by the "
                            "end of the next step"]
                out.append(Finding(
                    "warning", "checkpoint-state-not-restored", "09",
                    "a module is restored from another module's live state, not from the state "
                    "the checkpoint holds for it", evidence,
                    fix=f"load the checkpoint's own state: {item['type']}.load_state_dict("
                        f"checkpoint{item['entry']})",
                    where=item["where"]))
    return out
