"""Lesson 15, going further: what compiling the DDP wrapper itself does on torch 2.13.

DDP's forward breaks dynamo's graph on its own (its C++ logger, called in `_pre_forward` on every
forward with grad on: torch/nn/parallel/distributed.py:1757, the same in 2.14.1; DDP's Python, so
on any backend and build; its `_inside_ddp_forward` context manager, marked skip), so the module
inside is compiled as a frame of its own -- and a frame whose code is torch.nn's (an `nn.Sequential`)
is skipped when it starts a frame (torch/_dynamo/trace_rules.py `check_file`: torch.nn is
inlined only when called from traced code)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.compilewatch import CompileWatch
from ...launching.rankinfo import ddp_kwargs, device
from .modules import Tower


def compile_wrapper(fullgraph: bool = True, inside: bool = False) -> dict:
    """A Tower in DDP (`bucket_cap_mb=1`: more than one bucket), compiled with `fullgraph`: the
    DDP wrapper (`inside=False`) or the module inside it (`inside=True`, `module.compile(...)`
    before the step). Graphs compiled, and why each ends where it does."""
    dev = device()
    torch.compiler.reset()
    torch.manual_seed(0)
    model = Tower().to(dev)
    ddp = DDP(model, bucket_cap_mb=1, **ddp_kwargs(dev))
    with CompileWatch() as watch:
        if inside:
            model.compile(fullgraph=fullgraph, backend=watch.backend)
            run = ddp
        else:
            run = torch.compile(ddp, fullgraph=fullgraph, backend=watch.backend)
        run(torch.randn(8, 256, device=dev)).pow(2).mean().backward()
        watch.step()
    return {"graphs": len(watch.graphs), "ops": sum(map(len, watch.graphs)),
            "split_reasons": sorted({r for r in watch.reasons if r})}


def compile_container(container: bool = True) -> dict:
    """`torch.compile(DDP(model))` where `model` is an `nn.Sequential` of Linear and ReLU
    (`container=True`) or the same layers in a custom module (a `Tower`): graphs compiled."""
    dev = device()
    torch.compiler.reset()
    torch.manual_seed(0)
    tower = Tower(depth=2)
    model = (torch.nn.Sequential(tower.layers[0], torch.nn.ReLU(), tower.layers[1], torch.nn.ReLU())
             if container else tower).to(dev)
    with CompileWatch() as watch:
        run = torch.compile(DDP(model, **ddp_kwargs(dev)), backend=watch.backend)
        for _ in range(2):
            run(torch.randn(8, 256, device=dev)).pow(2).mean().backward()
            watch.step()
    return {"graphs": len(watch.graphs), "ops": sum(map(len, watch.graphs))}


def compiler_collectives() -> dict:
    """One compiled DDP step (a small Tower) with dynamo's compiler collectives on
    (`torch._dynamo.config.enable_compiler_collectives`) on this rank's process group. torch 2.13
    wants a group of one device type (torch/_dynamo/output_graph.py:2573-2583): a "gloo" group
    serves CPU and CUDA (torch/distributed/distributed_c10d.py:312), so compiling raises."""
    from torch._dynamo import config

    dev = device()
    torch.compiler.reset()
    torch.manual_seed(0)
    with config.patch(enable_compiler_collectives=True):
        model = torch.compile(DDP(Tower(depth=2).to(dev), **ddp_kwargs(dev)), backend="aot_eager")
        model(torch.randn(8, 256, device=dev)).pow(2).mean().backward()
    return {"device_types": [d.type for d in dist.group.WORLD._device_types]}
