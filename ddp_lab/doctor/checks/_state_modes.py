"""state, part: the ranks run the same wrapped model's training forward in different modes.

The invariant: in every step, each rank's training forward of a wrapped model (through the DDP
wrapper or the FSDP2 root, with autograd on) runs in the same mode (`module.training`) as the
other ranks'. A rank left in eval() (after a validation run on rank 0 only) runs BatchNorm on
its running statistics and no dropout while the others train: the replicas compute different
functions, and DDP's broadcast of rank 0's buffers before each forward (torch 2.13,
torch/nn/parallel/distributed.py `_check_sync_bufs_pre_fwd`) hides it from a comparison of state.

What a rank records, per wrapped model: a forward pre-hook ORs one bit into the step's mask
(1: a training forward in train mode, 2: in eval mode), and `nn.Module.train` (which `eval()`
calls) is wrapped once to note the user's line and step of the last call on that model (the
wrapper or its module; a call on a submodule only is not noted). At each step's end, when the
mask differs from the last step's, one row [step, mask, the line of the last train/eval call].
The parent expands the rows per step and names the first step in which every rank ran a
training forward and the masks differ.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .api import Finding

KEY = "state-modes"
TRAIN, EVAL = 1, 2


class Modes:
    def __init__(self, ctx):
        self.ctx = ctx
        self.models: list[list] = []  # [wrapper, module, mask this step, last mask, rows, line]
        self._patched = False

    def model(self, w) -> None:
        if w.kind not in ("ddp", "fsdp2"):
            return
        entry = [w.wrapper, w.module, 0, 0, [], ""]
        self.models.append(entry)

        def forward(module, args):
            if torch.is_grad_enabled():
                entry[2] |= TRAIN if module.training else EVAL
        w.wrapper.register_forward_pre_hook(self.ctx.user_hook(forward, guarded=False))
        if not self._patched:
            self._patch()

    def _patch(self) -> None:
        self._patched = True
        original, modes, ctx = nn.Module.train, self, self.ctx

        def train(module, mode=True):
            if not ctx.checking:
                for entry in modes.models:
                    if module is entry[0] or module is entry[1]:
                        entry[5] = ctx.guard(ctx.user_line)() or entry[5]
            return original(module, mode)
        train.__wrapped__ = original
        nn.Module.train = train

    def step_end(self) -> None:
        changed = False
        for entry in self.models:
            mask = entry[2]
            if mask and mask != entry[3]:
                entry[4].append([self.ctx.step, mask, entry[5]])
                entry[3], changed = mask, True
            entry[2] = 0
        if changed:
            self.ctx.emit(KEY, [e[4] for e in self.models])


def _at(rows: list, step: int):
    found = None
    for row in rows:
        if row[0] > step:
            break
        found = row
    return found


def judge(ev) -> list[Finding]:
    per_rank = [r.get(KEY) or [] for r in ev.ranks]
    if len(per_rank) < 2 or not all(per_rank):
        return []
    out = []
    for i in range(min(len(p) for p in per_rank)):
        rows = [p[i] for p in per_rank]
        for step in sorted({row[0] for r in rows for row in r}):
            at = [_at(r, step) for r in rows]
            if any(a is None for a in at) or len({a[1] for a in at}) == 1:
                continue
            out.append(_finding(step, at))
            break
    return out


def _finding(step: int, at: list) -> Finding:
    word = {TRAIN: "train mode", EVAL: "eval mode", TRAIN | EVAL: "both modes"}
    masks = [a[1] for a in at]
    common = max(set(masks), key=lambda m: (masks.count(m), m == TRAIN))
    odd = [r for r, m in enumerate(masks) if m != common] or [0]
    line = next((at[r][2] for r in odd if at[r][2]), "")
    ev = [", ".join(f"rank {r}: {word[m]}" for r, m in enumerate(masks)) +
          f" in the training forward of step {step} (module.training at the wrapped model's "
          "forward, with autograd on)",
          "BatchNorm normalises with the batch's statistics in train mode and with its running "
          "ones in eval mode, dropout drops only in train mode: the ranks compute different "
          "functions of the same parameters, and DDP's broadcast of rank 0's buffers before "
          "each forward hides it from a comparison of the state"]
    if line:
        ev.append(f"rank {odd[0]}'s last train()/eval() of that model before it: {line}")
    return Finding(
        "warning", "ranks-train-in-different-modes", "01",
        f"the ranks train the model in different modes from step {step} on: "
        + ", ".join(f"rank {r} in {word[masks[r]]}" for r in odd),
        ev,
        "put the model back in train mode after evaluating (`model.train()` at the end of the "
        "evaluation, or at the start of every training step), on every rank",
        where=line)
