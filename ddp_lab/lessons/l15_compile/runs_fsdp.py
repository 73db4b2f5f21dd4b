"""Lesson 15 under FSDP2: lesson 12's tied model (a weight read outside its own unit), sharded
per child, then compiled whole (`torch.compile(model)`) or per block (each unit's
`module.compile()`). FSDP2's hooks are `torch._dynamo.disable`d (torch 2.13,
distributed/fsdp/_fully_shard/_fsdp_common.py `_dynamo_disable`), so a whole-model compile
breaks its graph at every unit's boundary."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from ...instruments.compilewatch import CompileWatch
from ..l12_sharded_modules.modules import TiedLM, tokens, units


def train_sharded(model_cls=TiedLM, per_block: bool = False, steps: int = 2) -> dict:
    """`model_cls()` sharded per child (then the root), compiled whole or per block, `steps`
    forward/backward passes on this rank's tokens."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = model_cls()
    plan = units(model)
    with CompileWatch() as watch:
        if per_block:
            for unit in plan[:-1]:
                unit.compile(backend=watch.backend)
        for unit in plan:
            fully_shard(unit)
        run = model if per_block else torch.compile(model, backend=watch.backend)
        for _ in range(steps):
            run(tokens(dist.get_rank())).float().pow(2).mean().backward()
            watch.step()
    return {"graphs": len(watch.graphs), "ops": sum(map(len, watch.graphs)),
            "breaks": len(watch.break_messages),
            "fsdp_breaks": sum("_fsdp_common.py" in m.splitlines()[0] for m in watch.break_messages),
            "graph_ops": watch.graphs}
