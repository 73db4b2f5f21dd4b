"""The gradients' path on each rank, for the state check's line when the replicas part: the last
backward of each step against DDP's forward (Backwards), and the norms taken from the gradients
(GradientReads, below).

DDP all-reduces the gradients of a backward only when its forward prepared the reducer: its
`_post_forward` calls `reducer.prepare_for_backward` when grad is enabled and
`require_backward_grad_sync` is True, and sets `require_forward_param_sync` to say which
(torch/nn/parallel/distributed.py:1828-1841). The gradients an optimizer step applies are the
sum of the step's backwards; the last of them must be one DDP prepared for, or what it adds is
this rank's own (a no_sync accumulation ends with a synced backward, which reduces the sum). Two
ways in: a backward through `ddp.module` (or the same output again) with no DDP forward since
the previous backward, and a forward that ran with the sync off (the flag set after the forward,
a forward inside no_sync with its backward outside). Recorded per step as "state-unsynced":
{step, line: the backward's, why, flag: the statements that set require_backward_grad_sync when
it changed between that forward and its backward}.
"""
from __future__ import annotations

from ..userline import stores, user_files

FLAG = "require_backward_grad_sync"


class Backwards:
    def __init__(self, ctx):
        self.ctx = ctx
        self.ddp: dict[int, object] = {}  # id(wrapper) -> wrapper, hooked
        self.hooks: dict[int, object] = {}
        self.prepared: dict[int, bool] = {}  # since the last backward: did its forward prepare?
        self.used: set = set()  # wrappers with a grad-enabled forward in this step
        self.last = None
        self.flag_lines = None

    def model(self, w) -> None:
        if w.kind == "compiled":  # a hook changes what dynamo traces: none inside a compiled model
            for key in [k for k, d in self.ddp.items() if any(m is d for m in w.module.modules())]:
                self.hooks.pop(key).remove()
                self.ddp.pop(key)
            return
        if w.kind != "ddp" or any(x.kind == "compiled" and any(m is w.wrapper for m in x.module.modules())
                                  for x in self.ctx.models):
            return
        key = id(w.wrapper)
        self.ddp[key] = w.wrapper
        self.hooks[key] = w.wrapper.register_forward_hook(self.ctx.user_hook(self._forward))

    def _forward(self, wrapper, args, output) -> None:
        import torch

        if torch.is_grad_enabled():  # an evaluation forward leaves the reducer as it was
            self.prepared[id(wrapper)] = bool(getattr(wrapper, "require_forward_param_sync", True))
            self.used.add(id(wrapper))

    def backward(self, func, args, kwargs, result) -> None:
        if not self.ddp:
            return
        why = None
        for key in self.used:
            prepared = self.prepared.pop(key, None)
            if prepared is None:
                why = "no DDP forward since the previous backward"
            elif not prepared:
                wrapper = self.ddp.get(key)
                why = ("DDP's forward ran with require_backward_grad_sync False, set True only after it"
                       if wrapper is not None and getattr(wrapper, FLAG, False)
                       else "DDP's forward ran with require_backward_grad_sync False")
        # the line only where it is told (a step whose last backward DDP did not prepare): a
        # user_line walks the stack, every step
        self.last = {"line": self.ctx.user_line() if why is not None else "", "why": why}

    def step_end(self) -> None:
        last, self.last = self.last, None
        self.used.clear()
        if last is None or last["why"] is None:
            return
        row = {"step": self.ctx.step, **last}
        if "only after it" in last["why"]:
            if self.flag_lines is None:
                self.flag_lines = stores(user_files(self.ctx.script, self.ctx.is_user_file), attr=FLAG)
            row["flag"] = self.flag_lines[:5]
        self.ctx.add("state-unsynced", row)


class GradientReads:
    """A norm taken from the optimizers' gradients (torch._foreach_norm, vector_norm, norm: what
    get_total_norm and clip_grad_norm_ call), at the steps the state check hashes: the user's
    line and a digest of the gradients it read ("state-grad-reads": {step, line, digest}). When
    replicas part at a step, a norm whose gradients differed between ranks was each rank's own
    (taken before their all_reduce): a per-rank value that, applied to the synchronised
    gradients (clip_grads_with_norm_), makes the ranks' updates differ. Only gradients of
    parameters the state check compares (not a sharded DTensor's: each rank's shard differs)."""

    def __init__(self, ctx, rank, due, digest, sharded):
        self.ctx, self.rank, self.due, self.digest, self.sharded = ctx, rank, due, digest, sharded
        self.count = 0
        self.pending: list = []  # (step, line, [(id, digest)]): kept at the step's end

    def _grads(self) -> set:
        return {id(p.grad) for opt in self.rank.optimizers for g in opt.param_groups for p in g["params"]
                if p.grad is not None and not self.sharded(p)}

    def read(self, func, args, kwargs, result) -> None:
        if not self.due(self.ctx.step) or self.count >= 200:
            return
        first = args[0] if args else kwargs.get("input", kwargs.get("self", kwargs.get("tensors")))
        # a leaf that needs no gradient, as a gradient is (activations cost nothing more); before
        # the first step no optimizer is known: sorted out at the step's end, when the one that stepped is
        read = [t for t in (first if isinstance(first, (list, tuple)) else [first])
                if getattr(t, "grad_fn", 0) is None and getattr(t, "requires_grad", True) is False]
        grads = self._grads() if read else set()
        mine = [t for t in read if id(t) in grads] if grads else read
        if mine:
            self.count += 1
            self.pending.append((self.ctx.step, self.ctx.user_line(), [(id(t), self.digest(t)) for t in mine]))

    def step_end(self) -> None:
        grads = self._grads() if self.pending else set()
        for step, line, found in self.pending:
            kept = [d for i, d in found if i in grads]
            if kept:
                self.ctx.add("state-grad-reads", {"step": step, "line": line, "digest": ",".join(kept)})
        self.pending.clear()
