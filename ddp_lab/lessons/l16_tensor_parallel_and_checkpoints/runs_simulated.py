"""Lesson 16's simulated world: a 2-D plan (FSDP2 across `dp`, tensor parallelism within `tp`)
checked at 64 ranks in ONE process, with PyTorch's fake process group.

The fake group (torch/testing/_internal/distributed/fake_pg.py, a private testing API) answers
every collective at once and moves no data: "it would produce wrong results for every
collective". What it shows is what this one rank would be given: meshes, placements, local
shapes, whether every op has a sharding rule, and so the bytes it holds. What it cannot show:
values, other ranks' views, time, traffic, activation peaks, hangs. The function runs in a
launched rank (`init_process_group=False`), never in the notebook's own process.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .modules import TinyLM, TinyLMFixed, tokens
from .runs import held

WRITTEN_FOR = "2.13.0"
FAKE_API = ("torch.testing._internal.distributed.fake_pg.FakeStore and the process-group "
            "backend 'fake'")
SIZES = (1, 2, 4, 8, 16, 32, 64)


def fake_store():
    """PyTorch's fake store; importing it registers the "fake" backend. A private API: when a
    torch release moves it, say so instead of failing somewhere below."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as exc:
        raise ImportError(f"lesson 16 simulates a large world with PyTorch's private {FAKE_API}, "
                          f"written for torch {WRITTEN_FOR}; torch {torch.__version__} has "
                          f"moved or removed it ({exc})") from exc
    return FakeStore()


@contextlib.contextmanager
def fake_world(size: int):
    """This process as rank 0 of `size` ranks that do not exist."""
    dist.init_process_group("fake", store=fake_store(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def separate_meshes(dp: int, tp: int):
    """Broken: a mesh for each kind of parallelism, each made on its own."""
    from torch.distributed.device_mesh import init_device_mesh

    return (init_device_mesh("cpu", (dp,), mesh_dim_names=("dp",)),
            init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",)))


def sliced_meshes(dp: int, tp: int):
    """The fix: one 2-D mesh (dp x tp), sliced by name: `tp` groups neighbouring ranks (on
    GPUs, those of one machine), `dp` the ranks that hold the same part of the model."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    return mesh["dp"], mesh["tp"]


def split_2d(model, dp_mesh, tp_mesh):
    """Tensor parallelism within `tp`, then FSDP2 across `dp`: each block a unit, the root."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, model.tp_plan())
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    return fully_shard(model, mesh=dp_mesh)


def param_bytes_by_size(model_cls) -> dict:
    """Parameter bytes rank 0 holds when `model_cls` is split by its plan over n ranks, for
    each n in SIZES: meshes of ranks 0..n-1 of the fake world (no forward: placements only)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import parallelize_module

    out = {}
    for n in SIZES:
        model = model_cls()
        parallelize_module(model, DeviceMesh("cpu", list(range(n))), model.tp_plan())
        out[n] = held(model, torch.optim.Adam(model.parameters()))["params"]
    return out


def simulate(meshes=separate_meshes, world: int = 64, tp: int = 4) -> dict:
    """Split TinyLMFixed over `world` fake ranks, `tp` of them per tensor-parallel group, with
    the meshes `meshes(dp, tp)` gives; one training step (forward, backward, Adam) as rank 0.
    Then, in the same fake world, parameter bytes per rank for each plan by world size."""
    with fake_world(world):
        dp_mesh, tp_mesh = meshes(world // tp, tp)
        torch.manual_seed(0)
        model = split_2d(TinyLMFixed(), dp_mesh, tp_mesh)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(tokens(0)).float().pow(2).mean().backward()
        opt.step()
        shapes = {n: (tuple(p.shape), tuple(p.to_local().shape), str(p.placements))
                  for n, p in model.named_parameters()}
        bytes_2d = held(model, opt)
        curves = {"TinyLM": param_bytes_by_size(TinyLM),
                  "TinyLMFixed": param_bytes_by_size(TinyLMFixed)}
        backend = dist.get_backend()
    unsharded = 4 * sum(p.numel() for p in TinyLMFixed().parameters())
    return {"backend": backend, "world_size": world, "mesh": (world // tp, tp), "shapes": shapes,
            "bytes": bytes_2d, "unsharded_param_bytes": unsharded,
            "param_share": bytes_2d["params"] / unsharded, "curves": curves}
