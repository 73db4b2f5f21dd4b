"""The state check's memory on each rank (state.py): the tensors it watches by id and storage,
the edits made to them outside the optimizer (per user line), the optimizers that step (weakly)
and the names it gave their parameters."""
from __future__ import annotations

import weakref

from ..frames import first_of


def is_sharded(p) -> bool:
    placements = getattr(p, "placements", None)
    return placements is not None and any(not pl.is_replicate() for pl in placements)


def comparable(watched) -> list[tuple]:
    """(model index, watched, {name: param}, {name: buffer}, sharded count) per DDP or FSDP2
    model, each plain module once."""
    out, seen = [], set()
    for i, w in enumerate(m for m in watched if m.kind in ("ddp", "fsdp2")):
        if id(w.module) in seen:
            continue
        seen.add(id(w.module))
        if w.kind == "ddp":
            ignore = set(getattr(w.wrapper, "parameters_to_ignore", ()) or ())
            params = {n: p for n, p in w.module.named_parameters() if n not in ignore}
            sync = getattr(w.wrapper, "forward_sync_buffers", getattr(w.wrapper, "broadcast_buffers", True))
            buffers = {} if sync else {n: b for n, b in w.module.named_buffers() if n not in ignore}
            out.append((i, w, params, buffers, 0))
        else:
            named = list(w.module.named_parameters())
            params = {n: p for n, p in named if not is_sharded(p)}
            out.append((i, w, params, dict(w.module.named_buffers()), len(named) - len(params)))
    return out


class Rank:
    """What one rank keeps: the watched tensors by id and storage, the edits made to them
    outside the optimizer (per user line), and whether an optimizer is stepping."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.in_optimizer = False
        self.ids: dict[int, tuple] = {}
        self.ptrs: dict[int, tuple] = {}
        self.edits: dict[str, dict] = {}
        self.dirty = False
        self.cost = 0.0  # seconds spent hashing (the README's cost figure)
        self._optimizers: list = []  # weak: a script that builds a new one per phase frees the old
        self.started: dict = {}  # name -> digest before its optimizer's first step
        self.labels: dict = {}  # id(param) -> (its name in the records, the param), see outside()
        self.modules: dict[int, tuple] = {}  # id -> (qualified name, the module, kept)
        self.buffers_named: set = set()

    @property
    def optimizers(self) -> list:
        return [o for o in (r() for r in self._optimizers) if o is not None]

    def stepping(self, opt) -> bool:
        """Remember `opt`; True the first time it steps."""
        if any(o is opt for o in self.optimizers):
            return False
        self._optimizers.append(weakref.ref(opt))
        return True

    def refresh(self) -> None:
        self.ids.clear()
        self.ptrs.clear()
        models = comparable(self.ctx.models)
        for i, w, _, _, _ in models:
            prefix = f"model{i}." if len(models) > 1 else ""
            self.modules.update({id(m): (prefix + n, m) for n, m in w.module.named_modules()})
            for kind, named in (("parameter", w.module.named_parameters()),
                                ("buffer", w.module.named_buffers())):
                for n, t in named:
                    self._remember(t, (kind, prefix + n))

    def _remember(self, t, entry) -> None:
        self.ids[id(t)] = (entry, t)  # the tensor kept: its id is not reused while we look
        if not hasattr(t, "_local_tensor"):
            try:
                ptr = t.data_ptr()
            except (RuntimeError, AttributeError):
                return
            if ptr:
                self.ptrs[ptr] = (entry, t)

    def lookup(self, t):
        """The (kind, name) of a watched tensor: `t` itself, or a view of its storage (`.data`)
        while the tensor still lives there."""
        found = self.ids.get(id(t))
        if found is not None and found[1] is t:
            return found[0]
        if hasattr(t, "_local_tensor") or not hasattr(t, "data_ptr"):
            return None
        try:
            ptr = t.data_ptr()
            found = self.ptrs.get(ptr)
            return found[0] if found is not None and found[1].data_ptr() == ptr else None
        except RuntimeError:
            return None

    def wrote(self, t, frame) -> None:
        entry = self.lookup(t)
        if entry is not None and not self.in_optimizer:
            self.record(entry, frame)

    def record(self, entry, frame) -> None:
        if entry in self.buffers_named:
            return  # a buffer's writer is named once (BatchNorm writes its stats every forward)
        if first_of(frame, self.ctx.is_user_file) == "theirs":
            return  # DDP's or FSDP's own copies, the optimizer's update
        line = self.ctx.user_line(frame)
        if not line:
            return
        kind, name = entry
        e = self.edits.setdefault(f"{kind} {line}", {"kind": kind, "line": line, "names": [],
                                                      "step": self.ctx.step, "count": 0})
        e["count"] += 1
        if name not in e["names"] and len(e["names"]) < 20:
            e["names"].append(name)
        if kind == "buffer":
            self.buffers_named.add(entry)
        self.dirty = True

    def flush(self) -> None:
        if self.dirty:
            self.ctx.emit("state-edits", list(self.edits.values()))
            self.dirty = False
