"""Measurement harness for the control set (not part of any control script).

Run as the torchrun entry point in place of a script:

    torchrun --standalone --nproc-per-node 2 _probe/probe.py SCRIPT [ARGS...]

with PROBE_OUT=<dir>.  It installs observers through public torch APIs (global
optimizer step hooks) and thin wrappers (Tensor.backward, DistributedSampler
__iter__, random_split, torch.save / torch.load), then runs SCRIPT as __main__
exactly as torchrun would (same argv, cwd, env; no seeding).  Each rank writes
PROBE_OUT/rank<R>.pt at exit.  measure.py files read those records.
"""
import atexit
import os
import runpy
import sys

import torch
import torch.utils.data
import torch.utils.data.dataset
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils.data.distributed import DistributedSampler

OUT = os.environ["PROBE_OUT"]
RANK = int(os.environ.get("RANK", "0"))

rec = {
    "rank": RANK,
    "initial_seed": torch.initial_seed(),
    "steps": [],          # one dict per optimizer.step()
    "losses": [],         # value of every tensor .backward() was called on
    "sampler_iters": [],  # index list of every DistributedSampler iteration
    "random_splits": [],  # index lists of every random_split call
    "saves": [],          # structure of every torch.save
    "loads": [],          # every torch.load: kwargs and outcome
    "final_params": None,
    "exc": None,
}
_prev = {}
_pending_losses = []


def _local(t):
    if hasattr(t, "to_local"):
        t = t.to_local()
    return t.detach()


def _params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def _flat(ps):
    if not ps:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat([_local(p).reshape(-1).to(torch.float64) for p in ps])


def _pre(opt, args, kwargs):
    ps = _params(opt)
    with torch.no_grad():
        grads = [_local(p.grad) for p in ps if p.grad is not None]
        gnorm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))) if grads else 0.0
        flat = _flat(ps)
    _prev[id(opt)] = flat
    rec["_pre"] = {
        "grad_norm": gnorm,
        "n_params": len(ps),
        "n_with_grad": len(grads),
        "pre_nonfinite": int((~torch.isfinite(flat)).sum()),
        "pre_absmax": float(flat[torch.isfinite(flat)].abs().max()) if torch.isfinite(flat).any() else 0.0,
        "pre_param_sum": float(flat.sum()),
    }


def _post(opt, args, kwargs):
    ps = _params(opt)
    with torch.no_grad():
        flat = _flat(ps)
        prev = _prev.get(id(opt))
        delta = float((flat - prev).norm()) if prev is not None and prev.shape == flat.shape else float("nan")
    d = dict(rec.pop("_pre", {}))
    d.update(
        opt=type(opt).__name__,
        opt_id=id(opt),
        param_sum=float(flat.sum()),
        param_abs_sum=float(flat.abs().sum()),
        nonfinite=int((~torch.isfinite(flat)).sum()),
        numel=int(flat.numel()),
        delta=delta,
        losses=list(_pending_losses),
    )
    _pending_losses.clear()
    rec["steps"].append(d)
    rec["final_params"] = flat.float()


register_optimizer_step_pre_hook(_pre)
register_optimizer_step_post_hook(_post)

_orig_backward = torch.Tensor.backward


def _backward(self, *a, **k):
    try:
        if self.numel() == 1:
            v = float(_local(self).float().reshape(()))
            rec["losses"].append(v)
            _pending_losses.append(v)
    except Exception:
        pass
    return _orig_backward(self, *a, **k)


torch.Tensor.backward = _backward

_orig_sampler_iter = DistributedSampler.__iter__


def _sampler_iter(self):
    idx = list(_orig_sampler_iter(self))
    rec["sampler_iters"].append({"epoch": self.epoch, "indices": idx, "dataset_len": len(self.dataset)})
    return iter(idx)


DistributedSampler.__iter__ = _sampler_iter

_orig_random_split = torch.utils.data.dataset.random_split


def _random_split(dataset, lengths, generator=None):
    kw = {} if generator is None else {"generator": generator}
    parts = _orig_random_split(dataset, lengths, **kw)
    rec["random_splits"].append({"with_generator": generator is not None,
                                 "indices": [list(p.indices) for p in parts]})
    return parts


torch.utils.data.random_split = _random_split
torch.utils.data.dataset.random_split = _random_split


def _describe(obj, depth=0):
    if isinstance(obj, dict) and depth < 2:
        return {str(k): _describe(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, dict):
        return {"__keys__": [str(k) for k in obj.keys()]}
    if isinstance(obj, torch.Tensor):
        return "tensor" + str(tuple(obj.shape))
    return type(obj).__name__


_orig_save = torch.save
_orig_load = torch.load


def _save(obj, f, *a, **k):
    rec["saves"].append({"path": str(f), "structure": _describe(obj)})
    return _orig_save(obj, f, *a, **k)


def _load(f, *a, **k):
    entry = {"path": str(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__,
             "kwargs": {kk: repr(vv) for kk, vv in k.items()}}
    rec["loads"].append(entry)
    try:
        out = _orig_load(f, *a, **k)
        entry["ok"] = True
        return out
    except Exception as e:  # noqa: BLE001
        entry["ok"] = False
        entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        raise


torch.save = _save
torch.load = _load


def _dump():
    rec.pop("_pre", None)
    os.makedirs(OUT, exist_ok=True)
    _orig_save(rec, os.path.join(OUT, f"rank{RANK}.pt"))


atexit.register(_dump)

script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
except BaseException as e:  # noqa: BLE001
    rec["exc"] = f"{type(e).__name__}: {str(e)[:3000]}"
    raise
