"""Lesson 12's memory measurement, on each rank: the bytes of parameters, gradients and
optimizer state a rank holds after two Adam steps, counted from the tensors' own storage
(each storage once), under DDP (ZeRO stage 0), DDP + ZeroRedundancyOptimizer (stage 1),
FSDP2 (stage 3) and DeepSpeed's ZeRO stages 1, 2 and 3; for DDP also its gradient buckets,
which the ZeRO formula does not count.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import torch

from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import WIDTH, features
from .runs import shard

STAGES = {"ddp": 0, "zero1": 1, "fsdp2": 3, "ds1": 1, "ds2": 2, "ds3": 3}


def wide_mlp() -> torch.nn.Module:
    """Big enough that the step counters and biases do not blur the picture."""
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 4))


def storage_bytes(tensors) -> int:
    """The bytes of the distinct storages behind `tensors` (a DTensor counts its local shard)."""
    seen = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        s = local.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def count_buckets(ddp) -> dict:
    """DDP's gradient buckets, seen by a communication hook that hands each bucket on to DDP's
    default all-reduce: {bucket index: bytes of its flat buffer}. With
    gradient_as_bucket_view=False (the default) that buffer is a second copy of the gradients
    beside each parameter's `.grad`."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    seen = {}

    def hook(state, bucket):
        seen[bucket.index()] = bucket.buffer().untyped_storage().nbytes()
        return allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, hook)
    return seen


def build(strategy: str):
    """The model and optimizer of one strategy; `module` is what holds the parameters, and
    `buckets` DDP's bucket bytes (empty for FSDP2)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    module = wide_mlp().to(device())
    if strategy == "fsdp2":
        model = shard(module)
        return model, module, torch.optim.Adam(model.parameters(), lr=1e-3), {}
    model = DDP(module, **ddp_kwargs(device()))
    buckets = count_buckets(model)
    if strategy == "zero1":
        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
        return model, module, opt, buckets
    return model, module, torch.optim.Adam(model.parameters(), lr=1e-3), buckets


def held_bytes(module, opt, buckets: dict) -> dict:
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    state = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
    params = list(module.parameters())
    held = {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params),
            "optim": storage_bytes(state)}
    return {**held, "buckets": sum(buckets.values())} if buckets else held


def _flat(obj) -> list:
    if torch.is_tensor(obj):
        return [obj]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return [t for v in items for t in _flat(v)]


def deepspeed_held(stage: int, steps: int) -> dict:
    """DeepSpeed ZeRO `stage`: `steps` steps, then one more backward (DeepSpeed frees the
    gradients at its step), counted through DeepSpeed 0.19.8's optimizer attributes. `optim`
    includes DeepSpeed's float32 master copy of the rank's partition.

    Both extras are of DeepSpeed 0.19.8 in float32 training. Stage 3 would share the model's
    own float32 partition as its master copy, but only when `tensor.device == self.device`
    (runtime/zero/stage3.py:1161-1162), and `self.device` is a string ('cpu', 'cuda:0') that a
    torch.device never equals on torch 2.13: it copies. Stages 1-2 keep the whole gradient of
    each parameter touching the partition unless gradients accumulate in float32 beside a
    16-bit model, which gets a partition-sized buffer (stage_1_and_2.py:1259-1266)."""
    from .runs_zero3 import zero3_engine

    torch.manual_seed(0)
    model = wide_mlp()
    engine = zero3_engine(model, stage=stage)
    x = features(rank_info().rank)
    for step in range(steps + 1):
        engine.backward(engine(x).pow(2).mean())
        if step < steps:
            engine.step()
    opt, params = engine.optimizer, list(model.parameters())
    grads = (opt.grad_partitions_flat_buffer if stage == 3 else opt.averaged_gradients)
    master = (opt.fp32_partitioned_groups_flat if stage == 3 else
              opt.single_partition_of_fp32_groups)
    return {"params": storage_bytes([getattr(p, "ds_tensor", p) for p in params]),
            "grads": storage_bytes(_flat(grads)),
            "optim": storage_bytes(_flat(list(opt.optimizer.state.values())) + _flat(master))}


def memory_per_rank(strategies=("ddp",), steps: int = 2) -> dict:
    """Per strategy: the bytes held on this rank after `steps` steps (gradients kept), and
    the number of parameters Psi of the whole model."""
    rank = rank_info().rank
    out = {}
    for strategy in strategies:
        if strategy.startswith("ds"):
            out[strategy] = deepspeed_held(STAGES[strategy], steps)
            continue
        model, module, opt, buckets = build(strategy)
        for _ in range(steps):
            opt.zero_grad()
            model(features(rank).to(device())).pow(2).mean().backward()
            opt.step()
        out[strategy] = held_bytes(module, opt, buckets)
        del model, module, opt
    psi = sum(p.numel() for p in wide_mlp().parameters())
    last = out["fsdp2" if "fsdp2" in out else strategies[-1]]
    return {"bytes": out, "psi": psi,
            "unsharded_share": sum(last.values()) / (16 * psi)}  # fp32 Adam: 4+4+8 bytes


def formula_bytes(stage: int, psi: int, world_size: int, k: int = 8, p: int = 4,
                  g: int = 4) -> dict:
    """The ZeRO paper's per-rank memory, (p + g + k) * Psi, each part divided by N once its
    stage partitions it. The paper's mixed-precision case is p = g = 2 bytes, K = 12; this
    lesson trains in float32 with Adam: p = g = 4, K = 8 (two moments)."""
    n = world_size
    return {"params": p * psi / (n if stage >= 3 else 1),
            "grads": g * psi / (n if stage >= 2 else 1),
            "optim": k * psi / (n if stage >= 1 else 1)}
