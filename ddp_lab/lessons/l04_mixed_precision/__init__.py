"""Lesson 04: mixed precision in custom modules. A custom autograd Function under autocast,
float16 gradients that underflow without a GradScaler, modules that choose their own dtypes,
the deprecated `torch.cuda.amp` API, and ZeroRedundancyOptimizer (ZeRO stage 1, torch-native).

The modules are in `modules.py`, the per-rank code in `runs.py`, the picture in `figures.py`.
"""
from __future__ import annotations

import torch

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from ...launching.cuda_init import gpu_count
from . import modules as m
from .figures import draw_precisions, figures, precision_runs
from .runs import amp_api_step, compare_precisions, fit_decoder, train_autocast, train_half_weights, zero_checkpoint

__all__ = ["LESSON", "train_autocast", "fit_decoder", "compare_precisions", "train_half_weights",
           "amp_api_step", "zero_checkpoint", "draw_precisions", "precision_runs", "SYNCED",
           "DTYPE_MISMATCH"]

SYNCED = Expect("ok", metric="drift", below=1e-6)
# CPU says "expected m1 and m2 to have the same dtype" or "mat1 and mat2 must have the same
# dtype"; CUDA words it "expected mat1 and mat2 to have the same dtype".
DTYPE_MISMATCH = r"(m1 and m2|mat1 and mat2) (must|to) have the same dtype"
# Precisions the underflow scenario trains, in order; the last one is the run measured.
REFERENCE_RUNS = (("fp32", False), ("bf16", False), ("fp16", False))
SCALED_RUNS = (("fp16", True),)
# A GradScaler grows its scale after `growth_interval` steps without inf (default 2000): every
# 2 steps here, so that 60 steps show the climb, the overflow and the skipped steps.
FAST_GROWTH = {"growth_interval": 2}


def _every_rank(key, wanted):
    def problems(result):
        return [f"rank {r.rank}: {key} = {r.value[key]!r}, expected {wanted!r}"
                for r in result.ranks if r.value[key] != wanted]
    return problems


def _skips_some_steps(result):
    skipped = result.ranks[0].value["skipped_steps"]
    return [] if skipped >= 1 else [f"the scaler skipped {skipped} steps, expected at least 1"]


def _cuda_amp_disabled_on_cpu(result):
    """On a machine without CUDA, torch.cuda.amp.autocast turns itself off: float32 outputs."""
    return [] if gpu_count() else _every_rank("out_dtype", "torch.float32")(result)


def _autocast(model_cls, expect, precision="bf16"):
    return Variant(train_autocast, expect, kwargs={"model_cls": model_cls, "precision": precision},
                   grace=2)


def _batch(rank):
    return m.example_batch(rank)


LESSON = Lesson(
    id="04",
    error_class="mixed precision",
    title="Mixed precision in custom modules: autocast, GradScaler, bfloat16",
    notebook="04_mixed_precision",
    figures=figures,
    scenarios=[
        Scenario("custom_function", "A custom autograd Function under autocast",
                 broken=_autocast(m.CustomOpNet, Expect("error", "RuntimeError", DTYPE_MISMATCH,
                                                        ranks=(0, 1))),
                 fixed=_autocast(m.CustomOpNetFixed, SYNCED),
                 summary="autocast hands the Function bfloat16 activations beside float32 weights; "
                         "its backward runs outside autocast and mixes them: decorate forward with "
                         "torch.amp.custom_fwd(cast_inputs=torch.float32), backward with custom_bwd",
                 module=ModuleCase(m.CustomOpNet, m.CustomOpNetFixed, _batch, amp="bf16")),
        Scenario("fp16_underflow", "float16 without a GradScaler: gradients underflow to 0",
                 broken=Variant(compare_precisions, Expect("ok", metric="zero_grad_fraction",
                                                           above=0.5),
                                kwargs={"runs": REFERENCE_RUNS}, timeout=60),
                 fixed=Variant(compare_precisions, Expect("ok", metric="zero_grad_fraction",
                                                          below=0.05, extra=_skips_some_steps),
                               kwargs={"runs": SCALED_RUNS, "scaler_options": FAST_GROWTH},
                               timeout=60),
                 summary="gradients below float16's smallest step (6e-8) become exactly 0 and "
                         "training stalls; torch.amp.GradScaler multiplies the loss first and "
                         "divides the gradients after. bfloat16 has float32's range: no scaler"),
        Scenario("buffer_dtype", "A float32 buffer updated in place from bfloat16 activations",
                 broken=_autocast(m.CentredFeatures, Expect("error", "RuntimeError",
                                  r"expected dtype float for `end` but got dtype c10::BFloat16",
                                  ranks=(0, 1))),
                 fixed=_autocast(m.CentredFeaturesFixed, SYNCED),
                 summary="lerp_ (like index_copy_ and scatter_) does not promote dtypes: cast the "
                         "statistic to the buffer's dtype, and the buffer to the activations'",
                 module=ModuleCase(m.CentredFeatures, m.CentredFeaturesFixed, _batch, amp="bf16")),
        Scenario("half_weights", "A module that stores its own weights in bfloat16",
                 broken=Variant(train_half_weights, Expect("error", "RuntimeError", DTYPE_MISMATCH,
                                                           ranks=(0, 1)),
                                kwargs={"model_cls": m.HalfWeightNet}, grace=2),
                 fixed=Variant(train_half_weights, Expect("ok", metric="frozen_fraction", below=0.01),
                               kwargs={"model_cls": m.FullWeightNet}),
                 summary="under autocast it trains, but most small updates round away; the float32 "
                         "evaluation then fails. Keep weights float32 and let autocast cast each op",
                 module=ModuleCase(m.HalfWeightNet, m.FullWeightNet, _batch, amp="bf16")),
        Scenario("deprecated_amp", "The source document's torch.cuda.amp calls",
                 broken=Variant(amp_api_step, Expect("ok", metric="future_warnings", above=0.5,
                                                     extra=_cuda_amp_disabled_on_cpu),
                                kwargs={"api": "torch.cuda.amp"}),
                 fixed=Variant(amp_api_step, Expect("ok", metric="future_warnings", below=0.5,
                                                    extra=_every_rank("out_dtype", "torch.float16")),
                               kwargs={"api": "torch.amp"}),
                 summary="torch.cuda.amp.autocast / GradScaler raise FutureWarnings, and without CUDA "
                         "they switch themselves off; torch.autocast(device_type) and "
                         "torch.amp.GradScaler(device) work on every device"),
        Scenario("zero_state_dict", "ZeroRedundancyOptimizer: saving a sharded optimizer",
                 broken=Variant(zero_checkpoint, Expect("error", "RuntimeError",
                                                        r"has not been consolidated", ranks=(0,)),
                                grace=2),
                 fixed=Variant(zero_checkpoint, Expect("ok", metric="shard_fraction", below=0.9,
                                                       metric_rank=None),
                               kwargs={"consolidate": True}),
                 summary="each rank holds only its shard of the Adam state (DeepSpeed's ZeRO stage 1); "
                         "consolidate_state_dict(to=0) on every rank before rank 0 saves it"),
    ],
)
