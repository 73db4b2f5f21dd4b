"""Lesson 01: parameters that are not registered, parameters that are not used, and what
DataParallel and DistributedDataParallel each do with them.

The modules are in `modules.py`, the per-rank code in `runs.py`. The walker that finds every
tensor a module holds (registered or not) is `ddp_lab.instruments.modwalk`, shared with the doctor; the
notebook reads it as `inventory`.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from ...instruments import modwalk as inventory
from ...launching.cuda_init import gpu_count
from . import modules as m
from .figures import figures
from .runs import find_unused_cost, train, who_runs_forward

__all__ = ["LESSON", "inventory", "train", "who_runs_forward", "find_unused_cost", "WITH_DEBUG_INFO",
           "WITH_DEBUG_DETAIL", "FIND_UNUSED", "STATIC_GRAPH"]

# With two GPUs, 2 ranks run on NCCL and CUDA: a tensor that `.to()` does not move then fails
# first as a device mismatch (lesson 02) before it can drift.
# Counted without initialising CUDA: the fork server imports this module (see cuda_init).
ON_GPUS = gpu_count() >= 2

SYNCED = Expect("ok", metric="drift", below=1e-6)
REDUCTION = r"Expected to have finished reduction in the prior iteration before starting a new one"
UNREGISTERED_DEVICE = Expect("error", "RuntimeError", r"same device", ranks=(0, 1))


def _never_moved(*names):
    """Extra check: the unregistered tensors `names` never changed on any rank."""
    def problems(result):
        return [f"rank {r.rank}: {n} moved by {r.value['moved'][n]:.3g}"
                for r in result.ranks for n in names if r.value["moved"][n] != 0.0]
    return problems


def _stopped_at_second_step(result):
    """Extra check: every rank finished step 0 and failed before finishing step 1."""
    return [f"rank {r.rank} stdout: {r.stdout!r}" for r in result.ranks
            if "step 0 done" not in r.stdout or "step 1 done" in r.stdout]


def _drifts(*never_moved):
    if ON_GPUS:
        return UNREGISTERED_DEVICE
    return Expect("ok", metric="drift", above=1e-3, extra=_never_moved(*never_moved))


def _train(model_cls, expect, **kwargs):
    return Variant(train, expect, kwargs={"model_cls": model_cls, **kwargs}, grace=2)


def _batch(rank):
    return m.example_batch(rank)


UNUSED_BROKEN = _train(m.AuxHeadNet, Expect("error", "RuntimeError", REDUCTION, ranks=(0, 1),
                                            extra=_stopped_at_second_step))
# The same broken run with TORCH_DISTRIBUTED_DEBUG=INFO in the ranks' environment: the error
# names the parameters.
WITH_DEBUG_INFO = replace(UNUSED_BROKEN, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"}, expect=Expect(
    "error", "RuntimeError", r"Parameters which did not receive grad for rank \d: "
    r"aux_head\.bias, aux_head\.weight", ranks=(0, 1)))
# DETAIL, the level the source document recommends, in the environment the rank starts with: the
# process group is then CREATED under DETAIL (PyTorch wraps it), and on this build (torch
# 2.13.0+cpu) DDP on that group segfaults, bug or not. A bug of this build, not a rule:
# dist.set_debug_level(dist.DebugLevel.DETAIL) after init_process_group does not crash (lesson 06).
WITH_DEBUG_DETAIL = replace(UNUSED_BROKEN, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, grace=1,
                            kwargs={"model_cls": m.AuxHeadNetFixed},
                            expect=Expect("crashed", match="SIGSEGV"))
FIND_UNUSED = replace(UNUSED_BROKEN, expect=SYNCED).with_kwargs(
    ddp_options={"find_unused_parameters": True})
STATIC_GRAPH = replace(UNUSED_BROKEN, expect=SYNCED).with_kwargs(ddp_options={"static_graph": True})

LESSON = Lesson(
    id="01",
    error_class="parameter registration",
    title="Parameters that don't sync: registration, unused parameters, DataParallel",
    notebook="01_parameter_registration",
    figures=figures,
    scenarios=[
        Scenario("plain_tensor", "A trainable tensor kept as a plain attribute",
                 broken=_train(m.GainNet, _drifts("gain")),
                 fixed=_train(m.GainNetFixed, SYNCED),
                 summary="torch.randn(..., requires_grad=True) is not in parameters(): DDP never "
                         "broadcasts or all-reduces it, SGD never steps it; use nn.Parameter",
                 module=ModuleCase(m.GainNet, m.GainNetFixed, _batch)),
        Scenario("plain_list", "Sub-modules and parameters kept in plain Python lists",
                 broken=_train(m.StackNet, _drifts("blocks[0].weight", "scales[0]")),
                 fixed=_train(m.StackNetFixed, SYNCED),
                 summary="modules and parameters in a list or dict are invisible to PyTorch; use "
                         "nn.ModuleList / nn.ModuleDict / nn.ParameterList / nn.ParameterDict",
                 module=ModuleCase(m.StackNet, m.StackNetFixed, _batch)),
        Scenario("no_parameters", "A module whose every tensor is unregistered",
                 broken=_train(m.BareLinear, Expect(
                     "error", "RuntimeError", r"DistributedDataParallel is not needed when a "
                     r"module doesn't have any parameter that requires a gradient", ranks=(0, 1))),
                 fixed=_train(m.BareLinearFixed, SYNCED),
                 summary="DDP refuses a module with no parameter that requires a gradient",
                 module=ModuleCase(m.BareLinear, m.BareLinearFixed, _batch)),
        Scenario("unused_parameter", "A parameter the forward pass leaves unused",
                 broken=UNUSED_BROKEN, fixed=_train(m.AuxHeadNetFixed, SYNCED),
                 summary="the reducer waits for a gradient that never comes and fails at the next "
                         "step; remove or use it (or find_unused_parameters / static_graph)",
                 module=ModuleCase(m.AuxHeadNet, m.AuxHeadNetFixed, _batch)),
        Scenario("static_graph_changing", "static_graph=True on a graph that changes",
                 broken=_train(m.AlternatingNet, Expect(
                     "error", "RuntimeError", r"Your training graph has changed in this iteration",
                     ranks=(0, 1)), ddp_options={"static_graph": True}),
                 fixed=_train(m.AlternatingNet, SYNCED,
                              ddp_options={"find_unused_parameters": True}),
                 summary="static_graph only fits a model that uses the same parameters every "
                         "step; a changing set needs find_unused_parameters=True"),
        Scenario("data_parallel", "DataParallel inside each rank instead of DDP",
                 broken=_train(m.SmallNet, Expect("ok", metric="drift", above=1e-3),
                               wrapper="dp"),
                 fixed=_train(m.SmallNet, SYNCED, wrapper="ddp"),
                 summary="DataParallel is one process driving threads; in a multi-process job "
                         "it syncs nothing, so each rank trains its own model"),
    ],
)
