"""The reference check's line trace (reference.py attaches it): on the distributed run's rank 0
and in the one-process reference, from each compared step's first batch to its end, the tensors
each line of the user's files assigns (and each of its functions returns), each kept as two
numbers per row (fixed random projections: the same row gives the same numbers).

Where the two runs part at step k, the reference compares its trace with rank 0's: the first line
whose batch-shaped tensor (rank 0's has B rows, the reference's N x B, the other dimensions the
same) holds a row the reference's does not, or whose other dimensions differ ((8, 8) on a rank,
(16, 16) in one process), is the line that made the difference: a statistic over the rank's own
batch (a mean, a std, in-batch negatives) where one process takes the global batch's. A row-wise
computation (a layer, a loss's terms) gives rank 0's rows among the reference's, in any order.

Python's trace function (sys.settrace) is set for the compared steps only, never over a
debugger's or coverage's own (then nothing is traced), and taken off when a model is compiled
(dynamo and a trace function do not mix) and after the last compared step.
"""
from __future__ import annotations

import os
import sys

from ..userline import describe

TRACED = "trace-s{step}.pt"
LINES = "reference.lines"
MOST_ROWS = 4096
MOST_PER_STEP = 400
MOST_NUMEL = 4_000_000
TOL = 1e-4  # a row's projection against the reference's, relative to the largest


class Trace:
    def __init__(self, ctx, cfg: dict, shared: dict):
        self.ctx, self.shared = ctx, shared  # shared["drawing"]: inside a DataLoader's __next__
        self.reference = cfg.get("role") == "reference"
        self.folder, self.steps = cfg["dir"], int(cfg.get("steps", 3))
        self.world = int(cfg.get("world", 1))
        self.users: dict = {}  # code -> whether it is the user's
        self.frames: dict = {}  # frame -> (previous line, {name: id})
        self.kept: list = []
        self.on = False

    def attach(self) -> None:
        if (not self.reference and self.ctx.rank != 0) or sys.gettrace() is not None:
            return
        self.on = True
        sys.settrace(self.on_call)
        self.ctx.on_step_end(self.step_end)
        self.ctx.on_model(lambda c, w: w.kind == "compiled" and self.stop())
        self.ctx.on_finish(lambda c: self.stop())

    def stop(self) -> None:
        if not self.on:
            return
        self.on = False
        if sys.gettrace() == self.on_call:
            sys.settrace(None)
        frame = sys._getframe(0)
        while frame is not None:  # frames already traced keep their trace function otherwise
            if frame.f_trace is not None and getattr(frame.f_trace, "__self__", None) is self:
                frame.f_trace = None
            frame = frame.f_back
        self.frames.clear()

    # --- Python's trace events ----------------------------------------------------------------
    def on_call(self, frame, event, arg):
        code = frame.f_code
        user = self.users.get(code)
        if user is None:
            user = self.users[code] = self.ctx.is_user_file(code.co_filename)
        return self.on_line if user and self.on else None

    def on_line(self, frame, event, arg):
        if not self.on:
            return None
        if event not in ("line", "return"):
            return self.on_line
        recording = (self.shared.get("drawn") == self.ctx.step and not self.shared.get("drawing")
                     and not self.ctx.checking and len(self.kept) < MOST_PER_STEP)
        before = self.frames.get(frame)
        if before is not None and recording:
            line, ids = before
            for name, value in frame.f_locals.items():
                if id(value) != ids.get(name) and _is_tensor(value):
                    self.ctx.guard(self.keep)(frame, line, name, value)
        if event == "return":
            if recording and arg is not None:
                for i, t in enumerate(arg if isinstance(arg, tuple) else (arg,)):
                    if _is_tensor(t):
                        self.ctx.guard(self.keep)(frame, frame.f_lineno, f"<return {i}>", t)
            self.frames.pop(frame, None)
            return self.on_line
        self.frames[frame] = (frame.f_lineno, {n: id(v) for n, v in frame.f_locals.items()
                                               if _is_tensor(v)})
        return self.on_line

    def keep(self, frame, line: int, name: str, t) -> None:
        if t.dim() == 0 or t.numel() > MOST_NUMEL or t.shape[0] > MOST_ROWS or t.is_complex():
            return
        self.kept.append((frame.f_code.co_filename, line, name,
                          list(t.shape), sketch(t)))

    # --- each step --------------------------------------------------------------------------
    def step_end(self, ctx) -> None:
        kept, self.kept = self.kept, []
        if ctx.step >= self.steps - 1:
            self.stop()
        if ctx.step >= self.steps:
            return
        import torch

        path = os.path.join(self.folder, TRACED.format(step=ctx.step))
        if not self.reference:
            torch.save(kept, path)
            return
        if not os.path.exists(path):
            return
        found = first_parting(torch.load(path, weights_only=True), kept, self.world)
        if found is not None:
            ctx.add(LINES, dict(found, s=ctx.step, where=describe(found.pop("file"), found["line"])))


def _is_tensor(v) -> bool:
    return type(v).__name__ in ("Tensor", "Parameter") and hasattr(v, "dim")


_WEIGHTS: dict = {}


def sketch(t):
    """Two numbers per row: the row (flattened, in float64) against two fixed random vectors."""
    import torch

    rows = t.detach().reshape(t.shape[0], -1).to("cpu", torch.float64)
    n = rows.shape[1]
    if n not in _WEIGHTS:
        _WEIGHTS[n] = torch.randn(n, 2, generator=torch.Generator().manual_seed(n),
                                  dtype=torch.float64)
    return rows @ _WEIGHTS[n]


def first_parting(theirs: list, mine: list, world: int) -> dict | None:
    """The first of rank 0's batch-shaped tensors (in the order its lines ran) that the
    reference's tensor of the same line, name and occurrence does not hold row for row."""
    import torch

    index: dict = {}
    for file, line, name, shape, rows in mine:
        index.setdefault((file, line, name), []).append((shape, rows))
    seen: dict = {}
    for file, line, name, shape, rows in theirs:
        key = (file, line, name)
        k = seen[key] = seen.get(key, -1) + 1
        if k >= len(index.get(key, ())):
            continue
        shape_r, rows_r = index[key][k]
        if not shape or shape_r[0] != world * shape[0] or world < 2:
            continue
        where = {"file": file, "line": line, "name": name, "shape": shape, "reference": shape_r}
        if shape_r[1:] != shape[1:]:
            return dict(where, why="shape")
        scale = float(rows_r.abs().max()) if rows_r.numel() else 0.0
        if scale == 0.0:
            continue
        nearest = torch.cdist(rows, rows_r).min(dim=1).values
        apart = int((nearest > TOL * scale).sum())
        if apart:
            return dict(where, why="rows", apart=apart, rel=float(nearest.max()) / scale)
    return None
