"""ddp_settings, part: gradient accumulation that DDP synchronises on every micro-batch.

The invariant: within one optimizer step of a DDP model, a backward that DDP all-reduces,
followed by another backward of the same model into the same (not zeroed) gradients before the
optimizer steps, all-reduced gradients that were not yet the step's: only the last all-reduce
counts, the earlier ones are wasted traffic (the result is the same). `model.no_sync()` for all
but the last micro-batch (or `require_backward_grad_sync = False`) is DDP's way out.

What DDP does (torch 2.13, torch/nn/parallel/distributed.py): `_pre_forward` calls
`reducer.prepare_for_forward()` and `_post_forward` `reducer.prepare_for_backward(...)` only
`if torch.is_grad_enabled() and self.require_backward_grad_sync`; `no_sync()` sets
`require_backward_grad_sync = False` for its block. The reducer's autograd hooks all-reduce the
buckets of a backward whose forward was so prepared.

What a rank records, per DDP model (a few booleans and ints per step):
- a forward pre-hook on the DDP wrapper: whether this forward's backward will be synchronised
  (`is_grad_enabled() and require_backward_grad_sync`, read as DDP reads it);
- on one parameter, a tensor hook (before its gradient accumulates: was `.grad` already there,
  i.e. not zeroed or set to None since?) and a post-accumulate-grad hook (a backward reached
  `.grad`; torch.autograd.grad, which accumulates nothing, fires neither);
- at a backward into a `.grad` already there, after a synchronised backward of the same step:
  one wasted all-reduce; the step ends (an optimizer's step) and it all starts over.
The line named: the user's frame when the first wasted one is seen (on CPU autograd runs the
backward on the calling thread: the loop's `loss.backward()`); where the hook ran on autograd's
device thread (a GPU), the user's line when that `backward()` returns. A backward run under
no_sync() whose forward ran outside it is counted (`backward_only`): DDP synchronises it all the
same (no_sync's docstring: "The forward pass should be included inside the context manager, or
else gradients will still be synchronized"; measured: 4 all-reduces for 4 such micro-batches).

Not judged: static_graph=True, a comm hook of the user's (register_comm_hook, a built-in hook:
the hook decides what is communicated), DDP's python reducer or delayed all-reduce. A
`zero_grad(set_to_none=False)` between two backwards with no step between is read as
accumulation (the gradient tensor is still there).
"""
from __future__ import annotations

import torch

KEY = "ddp-accum"
MIN_STEPS = 2  # steps with a wasted all-reduce before it is a finding


class _Accum:
    def __init__(self, ctx, w, param):
        self.ctx, self.w, self.param = ctx, w, param
        self.sync = False  # the last forward's backward will be all-reduced
        self.synced = False  # a synchronised backward reached .grad since the step began
        self.had_grad = False  # .grad was there when the running backward's gradient arrived
        self.wasted_now = 0  # wasted all-reduces in this step
        wrapper = w.wrapper
        self.rec = {"line": w.line, "where": "", "steps": 0, "synced_steps": 0,
                    "wasted_steps": 0, "wasted": 0, "first": None, "backward_only": 0,
                    "static_graph": bool(getattr(wrapper, "static_graph", False)),
                    "skipped": bool(getattr(wrapper, "_use_python_reducer", False)
                                    or getattr(wrapper, "_delay_all_reduce_all_params", False)),
                    "comm_hook": ""}
        # two hooks cheap enough to need no guard (a flag each); the third guards its own
        wrapper.register_forward_pre_hook(ctx.user_hook(self.forward, guarded=False))
        param.register_hook(ctx.user_hook(self.arrives, guarded=False))
        param.register_post_accumulate_grad_hook(ctx.user_hook(self.accumulated))

    def forward(self, module, args) -> None:
        self.sync = torch.is_grad_enabled() and bool(module.require_backward_grad_sync)

    def arrives(self, grad) -> None:
        self.had_grad = self.param.grad is not None

    def accumulated(self, param) -> None:
        if self.had_grad and self.synced:
            self.wasted_now += 1
            if self.rec["first"] is None:
                self.rec["first"] = self.ctx.step
                self.rec["where"] = self.ctx.user_line()  # "" on autograd's device thread
        if self.sync and not self.w.wrapper.require_backward_grad_sync:
            self.rec["backward_only"] += 1  # no_sync() around the backward, not the forward
        self.synced = self.synced or self.sync
        self.had_grad = False

    def backward_returned(self) -> None:
        if self.rec["first"] is not None and not self.rec["where"]:
            self.rec["where"] = self.ctx.user_line()

    def step_ended(self) -> None:
        rec = self.rec
        rec["steps"] += 1
        rec["synced_steps"] += self.synced
        if self.wasted_now:
            rec["wasted_steps"] += 1
            rec["wasted"] += self.wasted_now
        self.synced, self.wasted_now = False, 0

    def finished(self) -> None:
        hooks = getattr(self.w.wrapper, "_comm_hooks", None) or []
        name = ""
        try:
            name = self.w.wrapper._get_ddp_logging_data().get("comm_hook", "") or ""
        except Exception:  # noqa: BLE001 - DDP's logging data is a best effort
            pass
        self.rec["comm_hook"] = name or ("user" if hooks else "")


class Accumulations:
    """The DDP models the script wrapped, each with its _Accum."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.models: list[_Accum] = []

    def wrapped(self, ctx, w) -> None:
        if w.kind != "ddp":
            return
        param = next((p for p in w.module.parameters() if p.requires_grad), None)
        if param is None:
            return
        if not self.models:
            ctx.on_step_end(self.step_ended)
            ctx.on_finish(self.finished)
            ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward], self.returned)
        self.models.append(_Accum(ctx, w, param))

    def returned(self, func, args, kwargs, result) -> None:
        for m in self.models:
            m.backward_returned()

    def step_ended(self, ctx) -> None:
        for m in self.models:
            m.step_ended()

    def finished(self, ctx) -> None:
        for m in self.models:
            m.finished()
        ctx.emit(KEY, [dict(m.rec) for m in self.models])


def judged(ev) -> list[dict]:
    """Per model: rank 0's record with `wasted_steps` the fewest over the ranks, when every rank
    wasted all-reduces in at least MIN_STEPS steps and nothing excuses the model."""
    per_rank = [r.get(KEY) or [] for r in ev.ranks]
    out = []
    for i, rec in enumerate(per_rank[0] if per_rank else []):
        recs = [p[i] for p in per_rank if len(p) > i]
        if len(recs) < ev.world_size or any(r["static_graph"] or r["skipped"] or r["comm_hook"]
                                            for r in recs):
            continue
        wasted = min(r["wasted_steps"] for r in recs)
        if wasted >= MIN_STEPS:
            out.append(dict(rec, wasted_steps=wasted))
    return out
