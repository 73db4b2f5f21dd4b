"""What runs on each rank in lesson 16's tensor-parallel scenarios: a custom block split with
`parallelize_module`, checked against the same block unsplit; and the bytes each rank holds
under a plan. Every function here runs on a rank (through `ddp_lab.launch`); none starts a
process. DTensor is imported inside the functions (see modules.py); `prewarm()` has the fork
server import it once for every rank.

`compare` marks the split block's forward and its backward as two steps (`measured_step`): the
flight recorder's collectives come back by pass, `result.ranks[0].collectives_per_step()`.
A colwise layer then a rowwise one is one all-reduce in the forward AND one in the backward,
measured (torch 2.13, gloo; NCCL runs the same DTensor code): each ColwiseParallel wraps its
plain input as a Replicate DTensor (`DTensor.from_local`, torch/distributed/tensor/parallel/
style.py:106-112), and the gradient coming back to it is Partial (every rank holds a partial sum
through its share of the weight), which `from_local`'s backward all-reduces to Replicate
(torch/distributed/tensor/_api.py:239-283). One such all-reduce per colwise layer that reads the
input: 3 for Attention's separate q, k, v (a fused qkv Linear would cost one). None where the
input needs no gradient (a block fed the data itself), hence `x.requires_grad_()` below: inside a
model, a block's input comes from layers that train.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from ...instruments.probes import measured_step
from ...launching.rankinfo import device, rank_info
from ..l12_sharded_modules.runs_memory import storage_bytes
from .modules import Attention, TinyLM, features, tokens

TOLERANCE = 1e-4  # relative: split and whole differ by float rounding only (about 1e-7)


def mesh_of(size: int):
    """A one-dimensional mesh of ranks 0..size-1. Every rank of the job must call it (it makes
    a process group); a rank outside it gets a mesh it is not part of."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh(device().type, list(range(size)))


def is_dtensor(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def whole(t):
    """A DTensor's full value (a collective), or the tensor itself."""
    return t.full_tensor() if is_dtensor(t) else t


def describe(t) -> str:
    if is_dtensor(t):
        return (f"DTensor {t.placements[0]!r} of {tuple(t.shape)}, local "
                f"{tuple(t.to_local().shape)}")
    return f"Tensor {tuple(t.shape)}"


def watch(model, plan: dict, parallelize) -> dict:
    """Split `model` with `parallelize(model)`, recording what each module of the plan is
    handed (before the plan's own input hook) and what the code after it receives (after
    the plan's output hook); for a DTensor received, what DTensor makes of a mean over its
    last dimension."""
    seen = {}

    def got(name):
        def record(module, args):
            seen[name] = {"got": describe(args[0])}
        return record

    def gave(name):
        def record(module, args, out):
            seen[name]["gave"] = describe(out)
            if is_dtensor(out):
                seen[name]["mean(-1) of it"] = repr(out.pow(2).mean(-1).placements[0])
        return record
    for name in plan:
        model.get_submodule(name).register_forward_pre_hook(got(name))
    parallelize(model)
    for name in plan:
        model.get_submodule(name).register_forward_hook(gave(name))
    return seen


def relative(a, b, floor: float = 0.0) -> float:
    """|a - b| / |b|, with |b| taken as `floor` at least (a gradient that is zero in exact
    arithmetic must not turn rounding into a large relative error)."""
    return float((whole(a) - b).norm()) / max(float(b.norm()), floor)


def compare(model_cls=Attention, plan=None) -> dict:
    """Split `model_cls()` with `plan` (default: its own `tp_plan()`) over every rank, run a
    forward and backward on the same batch as the whole module, and measure the largest
    relative difference of the output and of every weight's gradient. The split block's forward
    and backward are two marked steps: the collectives each entered come back by step."""
    from torch.distributed.tensor.parallel import parallelize_module

    world = rank_info().world_size
    mesh = mesh_of(world)
    torch.manual_seed(0)  # the same weights on every rank, as tensor parallelism needs
    model = model_cls().to(device())
    ref = copy.deepcopy(model)
    plan = plan if plan is not None else model.tp_plan()
    seen = watch(model, plan, lambda m: parallelize_module(m, mesh, plan))
    # the same batch on every rank; it needs a gradient, as a block's input inside a model does
    x = features(0).to(device()).requires_grad_()
    with measured_step():  # step 1: the split block's forward
        y = model(x)
    want = ref(x)
    weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(device())
    loss = (whole(y) * weights).sum()
    with measured_step():  # step 2: its backward
        loss.backward()
    (want * weights).sum().backward()
    floor = 0.01 * max(float(q.grad.norm()) for q in ref.parameters())  # 1 % of the largest
    grads = {n: relative(p.grad, q.grad, floor) for (n, p), (_, q) in
             zip(model.named_parameters(), ref.named_parameters())}
    out = relative(y, want)
    return {"output_error": out, "grad_error": max(grads.values()),
            "rel_error": max(out, *grads.values()), "seen": seen, "world_size": world}


def held(model, opt) -> dict:
    """Bytes of parameters, gradients and optimizer state on this rank (each storage once)."""
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"params": storage_bytes(params), "grads": storage_bytes(p.grad for p in params),
            "optim": storage_bytes(state)}


def train_step(model, mesh) -> dict:
    """Split `model` with its plan over `mesh`, take one real Adam step; the bytes held."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, mesh, model.tp_plan())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(tokens(0).to(device())).float().pow(2).mean().backward()
    opt.step()
    return held(model, opt)


def memory_per_rank(model_cls=TinyLM, sizes=(2, 4)) -> dict:
    """For each mesh size n in `sizes` (ranks 0..n-1 of this job; the others wait), the bytes
    this rank holds after one Adam step of `model_cls` split by its plan."""
    rank = rank_info().rank
    meshes = {n: mesh_of(n) for n in sizes}  # every rank takes part in making each group
    out = {}
    for n, mesh in meshes.items():
        if rank < n:
            torch.manual_seed(0)
            out[n] = train_step(model_cls().to(device()), mesh)
        dist.barrier()
    unsharded = 4 * sum(p.numel() for p in model_cls().parameters())
    largest = max(sizes)
    return {"bytes": out, "unsharded_param_bytes": unsharded,
            "share": out[largest]["params"] / unsharded if largest in out else None}
