"""The reference check's rank side for what training is (reference.py attaches it): the model's
state before the first step, and at each compared step (ctx.step < steps) the gradients as the
optimizer is about to use them (DDP's average, and whatever the script did to them after
backward), the learning rates and the update each parameter received.

In the distributed run (role "watched") they are written to the run's folder (torch.save): by
rank 0 under DDP (its parameters are every rank's: the state check's business otherwise), by
every rank under FSDP2 (each its shards). In the one-process reference run (role "reference")
the model is first given the watched rank 0's initial state (a script that does not seed its
initialisation still compares), then each step's own tensors are compared there with the
distributed run's, and only plain numbers are recorded: per parameter, the relative difference
of its gradient and of its update, their ratio to the one-process ones, and the one-process
gradient's and update's norms (the judge weighs a tensor's difference against the whole model's).
"""
from __future__ import annotations

import os
import weakref


INIT = "init-r{rank}.pt"
STEP = "step-r{rank}-s{step}.pt"
COMPARED = "reference.compare"
MODEL = "reference.model"
MOST = 50_000_000  # parameters' elements compared at most (each step writes them twice)


def local(t):
    """A DTensor's local part (FSDP2's shard), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def shard_dim(p):
    """The dimension FSDP2 shards `p` along (Shard(d)), else None."""
    for placement in getattr(p, "placements", ()):
        dim = getattr(placement, "dim", None)
        if dim is not None:
            return dim
    return None


def batchnorms(module) -> list[str]:
    """BatchNorm layers that normalise by their own batch's statistics (not SyncBatchNorm),
    training: each rank's differ from the global batch's by design."""
    from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm

    return [n or type(m).__name__ for n, m in module.named_modules()
            if isinstance(m, _BatchNorm) and not isinstance(m, SyncBatchNorm) and m.training]


def dropouts(module) -> list[str]:
    from torch import nn

    return [n or type(m).__name__ for n, m in module.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def stats(w, r) -> tuple:
    """(relative difference |w - r| / |r|, ratio <w, r> / <r, r>) of two tensors, in float64."""
    if w is None or r is None or w.shape != r.shape:
        return None, None
    w, r = w.detach().double().reshape(-1), r.detach().double().reshape(-1)
    nr, diff = float(r.norm()), float((w - r).norm())
    if nr == 0.0:
        return (0.0, 1.0) if float(w.norm()) == 0.0 else (1e30, None)
    return diff / nr, float(w @ r) / (nr * nr)


def _norm(t) -> float | None:
    return None if t is None else float(t.detach().double().norm())


class Tensors:
    """One rank's side of the comparison (see the module's docstring)."""

    def __init__(self, ctx, cfg: dict):
        self.ctx, self.cfg = ctx, cfg
        self.reference = cfg.get("role") == "reference"
        self.folder, self.steps = cfg["dir"], int(cfg.get("steps", 3))
        self.world = int(cfg.get("world", 1))
        self.model = None  # the Watched model compared: the first DDP model, or FSDP2's root
        self.optimizer = None  # a weak reference to the first optimizer that steps: held
        # strongly, it outlived a script's rebuilt one, and the core's step rule then counted
        # no step of the new optimizer (a resume into a fresh trainer, corpus case b62)
        self.taken = None  # this step's {before, grad, lr} from the optimizer's pre-hook

    def attach(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.ctx.on_model(self.model_wrapped)
        handle = register_optimizer_step_pre_hook(self.ctx.guard(self.pre_step))
        self.ctx.on_step_end(self.step_end)
        self.ctx.on_finish(lambda c: handle.remove())

    # --- the model --------------------------------------------------------------------------
    def model_wrapped(self, ctx, w) -> None:
        if w.kind == "compiled":
            found = dropouts(w.module)
            if found:
                ctx.add(MODEL, {"compiled_dropout": found[:5]})
        if self.model is not None or w.kind != "ddp":
            return  # FSDP2's root is known once every unit is wrapped: at the first step
        self._take(w)
        if self.reference:
            self._load_initial(w.module)
        elif ctx.rank == 0:
            import torch

            torch.save({k: v.detach().clone() for k, v in w.module.state_dict().items()},
                       os.path.join(self.folder, INIT.format(rank=0)))

    def _take(self, w) -> None:
        self.model = w
        numel = sum(local(p).numel() for p in w.module.parameters())
        self.ctx.add(MODEL, {"kind": w.kind, "type": type(w.module).__name__, "line": w.line,
                             "numel": numel, "batchnorm": batchnorms(w.module)[:5],
                             "dtype": str(next(w.module.parameters()).dtype).replace("torch.", "")
                             if numel else ""})

    def _load_initial(self, module) -> None:
        import torch

        path = os.path.join(self.folder, INIT.format(rank=0))
        if not os.path.exists(path):
            return
        saved = torch.load(path, weights_only=True)
        differ = []
        with torch.no_grad():
            for k, v in module.state_dict().items():
                if k in saved and saved[k].shape == v.shape:
                    if not torch.equal(v, saved[k]):
                        differ.append(k)
                    v.copy_(saved[k])
        self.ctx.emit("reference.init", {"loaded": len(saved), "differed": differ[:5]})

    # --- one step -----------------------------------------------------------------------------
    def pre_step(self, opt, args, kwargs) -> None:
        if self.optimizer is None:
            self.optimizer = weakref.ref(opt)
        if opt is not self.optimizer() or self.ctx.step >= self.steps:
            return
        if self.model is None:
            roots = [w for w in self.ctx.models if w.kind == "fsdp2"]
            if not roots:
                return
            self._take(roots[0])
        writes = self.reference or self.model.kind == "fsdp2" or self.ctx.rank == 0
        numel = sum(local(p).numel() for p in self.model.module.parameters())
        if not writes or numel > MOST:
            return
        named = list(self.model.module.named_parameters())
        self.taken = {
            "before": {n: local(p).detach().clone() for n, p in named},
            "grad": {n: (local(p.grad).detach().clone() if p.grad is not None else None)
                     for n, p in named},
            "shard": {n: shard_dim(p) for n, p in named},
            "lr": [float(g["lr"]) for g in opt.param_groups],
            "bn": batchnorms(self.model.module)[:5]}

    def step_end(self, ctx) -> None:
        taken, self.taken = self.taken, None
        if taken is None:
            return
        import torch

        before = taken.pop("before")
        named = dict(self.model.module.named_parameters())
        taken["update"] = {n: local(named[n]).detach() - b for n, b in before.items() if n in named}
        if ctx.step == 0:
            taken["before"] = before
        if self.reference:
            self._compare(taken, ctx.step)
        else:
            torch.save(taken, os.path.join(self.folder, STEP.format(rank=ctx.rank, step=ctx.step)))

    def _theirs(self, step: int):
        """The distributed run's tensors of `step`, each whole (FSDP2's shards put together)."""
        import torch

        paths = [os.path.join(self.folder, STEP.format(rank=r, step=step)) for r in range(self.world)]
        parts = [torch.load(p, weights_only=True) for p in paths if os.path.exists(p)]
        if not parts:
            return None
        whole = parts[0]
        for key in ("grad", "update", "before"):
            for name, dim in whole.get("shard", {}).items():
                if dim is not None and key in whole and whole[key].get(name) is not None:
                    pieces = [p[key][name] for p in parts if p.get(key, {}).get(name) is not None]
                    whole[key][name] = torch.cat(pieces, dim=dim)
        return whole

    def _compare(self, mine: dict, step: int) -> None:
        theirs = self._theirs(step)
        if theirs is None:
            self.ctx.add(COMPARED, {"s": step, "missing": True})
            return
        rows = []
        for name, g in mine["grad"].items():
            g_rel, g_ratio = stats(theirs["grad"].get(name), g)
            u_rel, u_ratio = stats(theirs["update"].get(name), mine["update"].get(name))
            rows.append([name, g_rel, g_ratio, u_rel, u_ratio, _norm(g), _norm(mine["update"].get(name))])
        rec = {"s": step, "t": rows, "lr": [theirs["lr"], mine["lr"]], "bn": theirs.get("bn", [])}
        if "before" in mine and "before" in theirs:
            rec["init"] = max([stats(theirs["before"].get(n), b)[0] or 0.0
                               for n, b in mine["before"].items()] or [0.0])
        self.ctx.add(COMPARED, rec)
