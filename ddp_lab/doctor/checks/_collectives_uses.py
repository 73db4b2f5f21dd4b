"""The collectives check, on each rank: what two of the script's own collectives are given.

- A broadcast the script calls (`dist.broadcast` of a tensor of at most SMALL elements that is no
  model's parameter or buffer, `dist.broadcast_object_list`'s numbers): the values this rank
  held before it, and whether this rank had run a forward (a watched model's, or a loss
  function) since its last backward or optimizer step: a value computed there measures this
  rank's own data. The parent compares the ranks' values (BROADCASTS).
- An all_reduce of the gradient of a parameter a DDP model reduces itself (DDP's last forward
  prepared a synchronised backward: `require_forward_param_sync`, set in DDP's _post_forward,
  torch/nn/parallel/distributed.py:1829/1841; the parameter not among `parameters_to_ignore`;
  no comm hook of the user's, which may do anything): the gradients' squared norm before the
  call (DDP's average), after it and when the optimizer steps, per line and step (GRADS).
"""
from __future__ import annotations

import math
import weakref

BROADCASTS = "collective-broadcasts"
GRADS = "collective-grads"
SMALL = 64  # a decision, a flag, a metric: a few numbers (a batch or a weight is not one)
LOSSES = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
          "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div")
OURS = "torch.distributed.algorithms.ddp_comm_hooks"  # DDP's own comm hooks reduce as DDP does


def _sq(t) -> float:
    return float(t.detach().double().pow(2).sum())


class Uses:
    def __init__(self, ctx):
        import torch
        import torch.nn.functional as F

        self.ctx = ctx
        self.open = False  # a forward since this rank's last backward or optimizer step
        self.backwards = 0
        # (backwards when made, {grad's data_ptr: (wrapper, name, numel, weakref to the param)})
        self.grads: tuple = (-1, {})
        self.pending: dict = {}  # (line, step) -> this step's gradients all_reduced at line
        self.hooks: list = []  # (module, handle)

        def pre_hook(module, args) -> None:
            # Unguarded: it only sets a flag (a guard costs each forward a context manager). A
            # function, never a bound method: copy.deepcopy(model) (the script's EMA copy, the
            # checkpoints check's reload) copies a bound method's object, this check and its
            # context with it (open files: "cannot pickle '_io.TextIOWrapper' object").
            self.open = True
        self.pre_hook = pre_hook
        ctx.on_model(lambda c, w: self.hook_model(w))
        ctx.on_torch_function([getattr(F, n) for n in LOSSES if hasattr(F, n)],
                              lambda f, a, k, out: self.opened())
        ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward],
                              lambda f, a, k, out: self.closed(backward=True))
        ctx.on_step_end(lambda c: self.step_ended())
        ctx.on_finish(lambda c: self.flush(at_end=False))

    # --- the window: a forward since the last backward or step ------------------------------
    def opened(self, *args) -> None:
        self.open = True

    def closed(self, backward: bool = False) -> None:
        self.open = False
        self.backwards += backward

    def hook_model(self, w) -> None:
        """A forward pre-hook on the model: on a compiled one the OptimizedModule (its hooks
        run outside dynamo), never a module inside a compiled one (a hook there changes what
        dynamo traces: the logged check measured it)."""
        if w.kind == "compiled":
            inside = {id(m) for m in w.module.modules()}
            for module, handle in [h for h in self.hooks if id(h[0]) in inside]:
                handle.remove()
                self.hooks.remove((module, handle))
            target = w.wrapper
        elif any(x.kind == "compiled" and any(m is w.module for m in x.module.modules())
                 for x in self.ctx.models):
            return
        else:
            target = w.module
        if hasattr(target, "register_forward_pre_hook"):
            self.hooks.append((target, target.register_forward_pre_hook(self.pre_hook)))

    # --- broadcasts ----------------------------------------------------------------------------
    def broadcast(self, op: str, bound: dict, line: str, stack: list) -> None:
        import torch

        if op == "broadcast":
            t = bound.get("tensor")
            if (not isinstance(t, torch.Tensor) or t.numel() > SMALL or t.is_complex()
                    or self.model_state(t)):
                return
            values = [float(v) for v in t.detach().reshape(-1).tolist()]
        else:
            objects = bound.get("object_list") or []
            values = [float(v) if isinstance(v, (bool, int, float)) else None for v in objects]
            if len(values) > SMALL or all(v is None for v in values):
                return
        self.ctx.add(BROADCASTS, {"line": line, "stack": stack, "step": self.ctx.step,
                                  "src": bound.get("src"), "op": op, "open": self.open,
                                  "v": [None if v is None or math.isnan(v) else v for v in values]})

    def model_state(self, t) -> bool:
        """Whether `t` shares memory with a watched model's parameter or buffer."""
        ptr = t.data_ptr()
        for w in self.ctx.models:
            for p in (*w.module.parameters(), *w.module.buffers()):
                if p.data_ptr() <= ptr < p.data_ptr() + max(p.numel(), 1) * p.element_size():
                    return True
        return False

    # --- gradients DDP reduces -----------------------------------------------------------------
    def ddp_grad(self, t):
        """(the DDP wrapper, the parameter's name) whose gradient `t` is (its memory), or None."""
        if not any(w.kind == "ddp" for w in self.ctx.models):
            return None
        made, table = self.grads
        found = table.get(t.data_ptr())
        if found is None and made != self.backwards:
            table = {}
            for w in self.ctx.models:
                if w.kind != "ddp":
                    continue
                for name, p in w.wrapper.module.named_parameters():
                    if p.grad is not None:
                        table[p.grad.data_ptr()] = (w, name, p.grad.numel(), weakref.ref(p))
            self.grads = (self.backwards, table)
            found = table.get(t.data_ptr())
        if found is None or found[2] != t.numel():
            return None
        w, name, _, param = found
        ddp = w.wrapper
        if not getattr(ddp, "require_forward_param_sync", True) or name in getattr(
                ddp, "parameters_to_ignore", ()):
            return None  # the last forward was under no_sync (or without grad), or DDP ignores it
        if any(not getattr(h, "__module__", "").startswith(OURS) or "noop" in getattr(h, "__name__", "")
               for h, _ in getattr(ddp, "_comm_hooks", ())):
            return None  # a comm hook of the user's: what DDP reduces is theirs to say
        return w, name, param

    def grad_before(self, bound: dict):
        import torch

        t = bound.get("tensor")
        if not isinstance(t, torch.Tensor) or t.is_complex():
            return None
        found = self.ddp_grad(t)
        return None if found is None else (t, found, _sq(t))

    def grad_after(self, state, bound: dict, line: str) -> None:
        t, (w, name, param), before = state
        op = bound.get("op")
        agg = self.pending.setdefault((line, self.ctx.step), {
            "line": line, "step": self.ctx.step, "op": str(op if op is not None else "SUM"),
            "model": w.line, "names": [], "params": 0, "before": 0.0, "after": 0.0,
            "grads": []})
        agg["params"] += 1
        agg["before"] += before
        agg["after"] += _sq(t)
        if len(agg["names"]) < 3:
            agg["names"].append(name)
        agg["grads"].append(param)  # its .grad when the optimizer steps (t may be p.grad.data)

    def step_ended(self) -> None:
        self.closed()
        self.flush(at_end=True)

    def flush(self, at_end: bool) -> None:
        """Each line's gradients of this step, with their norm when the optimizer stepped."""
        for agg in self.pending.values():
            grads = [getattr(p(), "grad", None) for p in agg.pop("grads")]
            if at_end and all(g is not None for g in grads):
                agg["end"] = sum(_sq(g) for g in grads)
            self.ctx.add(GRADS, agg)
        self.pending = {}
