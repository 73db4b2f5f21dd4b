"""Bytes per rank under DeepSpeed ZeRO stages 0-3 (float32, torch Adam, 2 ranks, CPU + gloo),
counted from the tensors' storage after two steps and one more backward (gradients present),
beside the ZeRO paper's formula, the float32 master copy apart from the Adam state (lesson
12's figure counts them together).
Run: .venv/bin/python benchmarks/deepspeed_memory.py"""
from __future__ import annotations

import torch

import ddp_lab


def _flat(obj) -> list:
    if torch.is_tensor(obj):
        return [obj]
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    return [t for v in items for t in _flat(v)]


def held(stage: int) -> dict:
    from ddp_lab.lessons.l12_sharded_modules import features, storage_bytes, zero3_engine
    from ddp_lab.lessons.l12_sharded_modules.runs_memory import wide_mlp
    from ddp_lab.launching.rankinfo import rank_info

    torch.manual_seed(0)
    model = wide_mlp()
    engine = zero3_engine(model, stage=stage)
    x = features(rank_info().rank)
    for _ in range(2):
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    engine.backward(engine(x).pow(2).mean())
    opt, params = engine.optimizer, list(model.parameters())
    inner = getattr(opt, "optimizer", opt)
    grads = {0: lambda: [p.grad for p in params], 3: lambda: _flat(opt.grad_partitions_flat_buffer)}
    master = {0: lambda: [], 3: lambda: _flat(opt.fp32_partitioned_groups_flat)}
    return {"params": storage_bytes([getattr(p, "ds_tensor", p) for p in params]),
            "grads": storage_bytes(grads.get(stage, lambda: _flat(opt.averaged_gradients))()),
            "fp32 master": storage_bytes(master.get(stage, lambda: _flat(
                opt.single_partition_of_fp32_groups))()),
            "Adam state": storage_bytes(_flat(list(inner.state.values()))),
            "psi": sum(getattr(p, "ds_numel", p.numel()) for p in params)}


def main() -> None:
    from ddp_lab.lessons.l12_sharded_modules import formula_bytes, prewarm_deepspeed

    prewarm_deepspeed(wait=True)
    for stage in range(4):
        run = ddp_lab.launch(held, stage, world_size=2, timeout=300)
        for r in run.ranks:
            v = dict(r.value)
            psi = v.pop("psi")
            total = sum(formula_bytes(stage, psi, 2).values())
            parts = ", ".join(f"{k} {b / (4 * psi):.2f}" for k, b in v.items())
            print(f"stage {stage} rank {r.rank}: {parts} (x 4*Psi bytes); total "
                  f"{sum(v.values()) / total:.2f} x the formula's (4+4+8)*Psi/N split")


if __name__ == "__main__":
    main()
