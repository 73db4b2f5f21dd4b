"""Lesson 12: custom modules under sharding -- FSDP2 (`fully_shard`) and DeepSpeed ZeRO-3.

Outside its own unit's forward a sharded parameter is not a whole tensor: under FSDP2 it is a
`DTensor` holding this rank's shard, under ZeRO-3 an empty tensor of shape (0,). A weight read
by a second unit, a norm logged in the training loop, a penalty, a `state_dict()`: each either
fails with PyTorch's DTensor error or silently computes with the shard. The memory scenario
measures what sharding buys: bytes per rank by ZeRO stage.
"""
from __future__ import annotations

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from .figures import draw_memory, figures
from .modules import (Adapted, Gated, GatedFixed, RegisteredTie, Scaled, ScaledFixed, TiedLM,
                      TiedLMFixed, adapted, features, mlp, scaled_net, scaled_net_fixed,
                      tokens, units)
from .runs import (count_collectives, freeze_base, full_state_dict, log_weight_norm,
                   mixed_precision, norm_of_full, norm_of_shard, norm_reduced, save_and_reload,
                   shard, state_dict_as_is, train_adapted, train_tied)
from .runs_memory import STAGES, formula_bytes, memory_per_rank, storage_bytes
from .runs_zero3 import (DEEPSPEED_MODULES, edit_gathered, edit_master, generate, read_as_is,
                         read_gathered, squares, until_all_end, until_mine_ends, wanted_length,
                         zero3_edit, zero3_engine, zero3_penalty)

__all__ = ["LESSON", "TiedLM", "TiedLMFixed", "RegisteredTie", "Gated", "GatedFixed", "mlp",
           "units", "tokens", "features", "shard", "train_tied", "log_weight_norm",
           "norm_of_shard", "norm_of_full", "norm_reduced", "save_and_reload", "state_dict_as_is",
           "full_state_dict", "zero3_engine", "zero3_penalty", "squares", "read_as_is",
           "read_gathered", "memory_per_rank", "formula_bytes", "storage_bytes", "STAGES",
           "figures", "draw_memory", "Adapted", "adapted", "Scaled", "ScaledFixed", "scaled_net",
           "scaled_net_fixed",
           "count_collectives", "freeze_base", "train_adapted", "mixed_precision",
           "DEEPSPEED_MODULES", "generate", "until_mine_ends", "until_all_end", "wanted_length",
           "zero3_edit", "edit_gathered", "edit_master", "prewarm_deepspeed"]

MIXED = r"got mixed torch\.Tensor and DTensor, need to convert all torch\.Tensor to DTensor"
DS_TIMEOUT = 120.0  # deepspeed.initialize costs a rank seconds (more on a loaded machine)
SAME_DTYPE = r"mat1 and mat2 must have the same dtype, but got Float and BFloat16"


def prewarm_deepspeed(wait: bool = False) -> bool:
    """Have the fork server import DeepSpeed (and what deepspeed.initialize imports) once, so
    each ZeRO-3 rank starts in about a second instead of several. Lesson 12 only. It names
    DeepSpeed's accelerator (DS_ACCELERATOR: `cuda` with a GPU, else `cpu`, what DeepSpeed
    would pick), counted without initialising CUDA: DeepSpeed's own detection calls
    `torch.cuda.device_count()` and `is_available()` at import, which on a CUDA build would
    leave the fork server unable to fork a rank that can use CUDA. Without a GPU, neither the
    fork server nor a rank then logs DeepSpeed's "unable to detect" warning either."""
    import os

    import torch

    from ...launching import prewarm
    from ...launching.cuda_init import gpu_count

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if gpu_count() else "cpu")
    return prewarm(wait=wait, timeout=DS_TIMEOUT, modules=list(DEEPSPEED_MODULES),
                   env={"DS_ACCELERATOR": os.environ["DS_ACCELERATOR"]})


def prepare() -> None:
    """Before the lesson's scenarios (the tour calls it): DeepSpeed's C++ op built here, with
    progress on stderr, never inside a rank; DeepSpeed preloaded in the fork server."""
    import sys

    from ...instruments.deepspeed_ops import ensure_built

    ensure_built(say=lambda line: print(line, file=sys.stderr, flush=True))
    prewarm_deepspeed()

LESSON = Lesson(
    id="12",
    error_class="sharded modules (FSDP2, ZeRO-3)",
    title="Custom modules under sharding: FSDP2 and DeepSpeed ZeRO-3",
    notebook="12_sharded_modules",
    figures=figures,
    prepare=prepare,
    scenarios=[
        Scenario("tied_across_units", "A weight read by a second FSDP2 unit",
                 broken=Variant(train_tied, Expect("error", "RuntimeError",
                                                   r"aten\.mm\.default " + MIXED, ranks=(0, 1))),
                 fixed=Variant(train_tied, Expect("ok"), kwargs={"model_cls": TiedLMFixed}),
                 module=ModuleCase(TiedLM, TiedLMFixed, tokens, strategy="fsdp2"),
                 summary="the output projection reads the embedding's weight after the "
                         "embedding's unit resharded it; keep the tie inside one unit"),
        Scenario("read_outside_forward", "A weight norm logged outside forward under FSDP2",
                 broken=Variant(log_weight_norm, Expect("ok", metric="norm_error", above=0.1,
                                                        metric_rank=None)),
                 fixed=Variant(log_weight_norm, Expect("ok", metric="norm_error", below=1e-6,
                                                       metric_rank=None),
                               kwargs={"read": norm_reduced}),
                 module=ModuleCase(Gated, GatedFixed, features, strategy="fsdp2"),
                 summary="outside forward a weight is this rank's shard: its norm is silently "
                         "wrong and differs per rank; reduce it, weight.norm().full_tensor(), "
                         "on every rank (or gather the weight, weight.full_tensor())"),
        Scenario("frozen_part_in_unit", "A frozen part inside an FSDP2 unit",
                 broken=Variant(train_adapted, Expect("ok", metric="frozen_reduced_bytes",
                                                      above=100, metric_rank=None)),
                 fixed=Variant(train_adapted, Expect("ok", metric="frozen_reduced_bytes",
                                                     below=1, metric_rank=None),
                               kwargs={"freeze": freeze_base}),
                 summary="left out of the optimizer only, the frozen weight still gets a "
                         "gradient FSDP2 reduce-scatters every step; requires_grad_(False) in "
                         "the same unit: FSDP2 gathers it, never reduces it"),
        Scenario("mixed_precision_constants", "A custom module's constants under FSDP2's "
                 "bfloat16 policy",
                 broken=Variant(mixed_precision, Expect("error", "RuntimeError", SAME_DTYPE,
                                                        ranks=(0, 1))),
                 fixed=Variant(mixed_precision, Expect("ok", metric="rel_error", below=0.05,
                                                       metric_rank=None),
                               kwargs={"model_cls": ScaledFixed}),
                 module=ModuleCase(scaled_net, scaled_net_fixed, features, amp="bf16",
                                   strategy="fsdp2"),
                 summary="MixedPrecisionPolicy casts parameters and each unit's floating-point "
                         "inputs, not buffers or plain tensors: h * scale is float32 again; "
                         "compute in float32 and cast back"),
        Scenario("sharded_state_dict", "A sharded model's state_dict loaded into a plain module",
                 broken=Variant(save_and_reload, Expect("error", "RuntimeError",
                                                        r"aten\.copy_\.default " + MIXED,
                                                        ranks=(0, 1))),
                 fixed=Variant(save_and_reload, Expect("ok", metric="max_diff", below=1e-5),
                               kwargs={"take": full_state_dict}),
                 summary="model.state_dict() holds DTensor shards; get_model_state_dict with "
                         "full_state_dict=True, cpu_offload=True gives rank 0 plain tensors"),
        Scenario("zero3_penalty", "A weight penalty computed outside forward under ZeRO-3",
                 broken=Variant(zero3_penalty, Expect("ok", metric="penalty_error", above=0.99,
                                                      metric_rank=None), timeout=DS_TIMEOUT),
                 fixed=Variant(zero3_penalty, Expect("ok", metric="penalty_error", below=1e-6,
                                                     metric_rank=None),
                               kwargs={"gather": read_gathered}, timeout=DS_TIMEOUT),
                 summary="outside forward a ZeRO-3 parameter has shape (0,): the penalty is "
                         "silently 0.0; read it inside deepspeed.zero.GatheredParameters"),
        Scenario("zero3_edit_after_initialize", "A weight edited after deepspeed.initialize "
                 "under ZeRO-3",
                 broken=Variant(zero3_edit, Expect("ok", metric="off_after_step", above=0.1,
                                                   metric_rank=None), timeout=DS_TIMEOUT),
                 fixed=Variant(zero3_edit, Expect("ok", metric="off_after_step", below=0.01,
                                                  metric_rank=None),
                               kwargs={"edit": edit_master}, timeout=DS_TIMEOUT),
                 summary="GatheredParameters(modifier_rank=0) after initialize changes the "
                         "weights forward uses, and the next step overwrites them from the "
                         "float32 master copy; set that copy, safe_set_full_fp32_param"),
        Scenario("zero3_uneven_forwards", "ZeRO-3 ranks that run forward a different number "
                 "of times",
                 broken=Variant(generate, Expect("timeout", match="fetch_sub_module", ranks=(0,)),
                                timeout=DS_TIMEOUT),
                 fixed=Variant(generate, Expect("ok", metric="outputs_all_ranks", above=4.5,
                                                below=5.5),
                               kwargs={"keep_going": until_all_end}, timeout=DS_TIMEOUT),
                 summary="each ZeRO-3 forward gathers weights from every rank: a rank that "
                         "runs one more forward waits forever; all-reduce a 'finished' flag "
                         "every step and loop while any rank is not"),
        Scenario("memory_per_rank", "Bytes per rank: DDP, ZeRO-1, FSDP2 and DeepSpeed's stages",
                 broken=Variant(memory_per_rank, Expect("ok", metric="unsharded_share",
                                                        above=0.95)),
                 fixed=Variant(memory_per_rank, Expect("ok", metric="unsharded_share",
                                                       below=0.55),
                               kwargs={"strategies": tuple(STAGES)}, timeout=DS_TIMEOUT),
                 summary="DDP holds every byte of parameters, gradients and Adam state on "
                         "every rank; FSDP2 holds 1/N of each; DeepSpeed adds a float32 "
                         "master copy of its partition"),
    ],
)
