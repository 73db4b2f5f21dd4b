"""Lesson 02: tensors on the wrong device or dtype inside a custom module: constants kept as
plain attributes, tensors made in `forward`, device ids hard-coded, modules built on `meta`.

The modules are in `modules.py`, the per-rank code in `runs.py`, the pictures in `figures.py`.
"""
from __future__ import annotations

import os

import torch

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from ...launching import RunResult, sanitize
from ...launching.cuda_init import gpu_count
from . import modules as m
from .figures import figures
from .runs import (constants_across_ranks, hardcoded_cuda, materialise, train_cast,
                   wrap_for_device)

__all__ = ["LESSON", "train_cast", "constants_across_ranks", "wrap_for_device", "hardcoded_cuda",
           "materialise", "TO_BFLOAT16", "NO_INIT", "failing_line", "NO_GPU_FOR_HARDCODED"]

# With two GPUs, 2 ranks run on NCCL and CUDA: a constant that `.to()` leaves on the CPU then
# fails as a device mismatch before the ranks can disagree on it.
# Counted without initialising CUDA: the fork server imports this module (see cuda_init).
ON_GPUS = gpu_count() >= 2

# On CPU the cast shows the bug as a dtype mismatch; on CUDA the same bug is a device mismatch.
MISMATCH = r"same (dtype|device)|must have the same dtype"
SYNCED = Expect("ok", metric="drift", below=1e-6)


def failing_line(result: RunResult, in_file: str = os.path.basename(m.__file__)) -> str:
    """The innermost frame of the root cause's traceback in `in_file`, with its source line."""
    lines = sanitize(result.root_cause.error.traceback).splitlines()
    at = [i for i, line in enumerate(lines) if line.lstrip().startswith("File") and in_file in line]
    return "\n".join(line.strip() for line in lines[at[-1]:at[-1] + 2]) if at else ""


def _batch(model_cls):
    return lambda rank: m.example_batch(model_cls, rank)


def _cast(model_cls, expect, **kwargs):
    return Variant(train_cast, expect, kwargs={"model_cls": model_cls, **kwargs}, grace=2)


def _across(model_cls, expect):
    return Variant(constants_across_ranks, expect, kwargs={"model_cls": model_cls}, grace=2)


def _materialise(how, expect):
    return Variant(materialise, expect, kwargs={"how": how}, grace=2)


CAST_FAILS = Expect("error", "RuntimeError", MISMATCH, ranks=(0, 1))
# `.to(f"cuda:{rank}")` on a machine without a GPU (`hardcoded_cuda`): each build says it its way.
#   CPU build (pinned):        AssertionError: Torch not compiled with CUDA enabled
#   CUDA build, no GPU driver: RuntimeError: Found no NVIDIA driver on your system. Please check ...
# In a process forked after CUDA was initialised it would be "Cannot re-initialize CUDA in forked
# subprocess"; ddp_lab's fork server never initialises CUDA (ddp_lab.launching.cuda_init).
NO_GPU_FOR_HARDCODED = Expect("error", "AssertionError|RuntimeError",
                              r"Torch not compiled with CUDA enabled|Found no NVIDIA driver",
                              ranks=(0, 1))
CAST_BROKEN = _cast(m.RandomFeatures, CAST_FAILS)
# The same module cast to bfloat16 instead of float64: the same bug, the same error.
TO_BFLOAT16 = CAST_BROKEN.with_kwargs(dtype="bfloat16")
FINITE = Expect("ok", metric="nonfinite_tensors", below=0.5)
# Materialised with to_empty and never initialised: every tensor is NaN (deterministic mode).
NO_INIT = _materialise("to_empty", Expect("ok", metric="nonfinite_tensors", above=4.5))

LESSON = Lesson(
    id="02",
    error_class="device and dtype",
    title="Tensors on the wrong device or dtype",
    notebook="02_device_and_dtype",
    figures=figures,
    scenarios=[
        Scenario("constant_cast", "A constant kept as a plain attribute, after .to(dtype)",
                 broken=CAST_BROKEN, fixed=_cast(m.RandomFeaturesFixed, Expect("ok")),
                 summary="module.to() moves and casts parameters and buffers only; register "
                         "constants with register_buffer",
                 module=ModuleCase(m.RandomFeatures, m.RandomFeaturesFixed,
                                   _batch(m.RandomFeatures))),
        Scenario("constant_across_ranks", "A random constant that each rank draws for itself",
                 broken=_across(m.RandomFeatures, CAST_FAILS if ON_GPUS else Expect(
                     "ok", metric="drift", above=1e-3)),
                 fixed=_across(m.RandomFeaturesFixed, SYNCED),
                 summary="DDP broadcasts parameters and buffers from rank 0, not plain tensors: "
                         "each rank keeps its own random constant",
                 module=ModuleCase(m.RandomFeatures, m.RandomFeaturesFixed,
                                   _batch(m.RandomFeatures))),
        Scenario("forward_tensor", "A tensor made in forward with the default device/dtype",
                 broken=_cast(m.TinyRNN, CAST_FAILS), fixed=_cast(m.TinyRNNFixed, Expect("ok")),
                 summary="torch.zeros(n) in forward is float32 on the CPU whatever the module is; "
                         "derive it from the input: x.new_zeros(...)",
                 module=ModuleCase(m.TinyRNN, m.TinyRNNFixed, _batch(m.TinyRNN))),
        Scenario("device_ids_on_cpu", "device_ids passed for a module on the CPU",
                 broken=Variant(wrap_for_device, Expect(
                     "error", "ValueError", r"device_ids and output_device arguments only work "
                     r"with single-device/multiple-device GPU modules or CPU modules",
                     ranks=(0, 1)), kwargs={"pattern": "source"}, grace=2),
                 fixed=Variant(wrap_for_device, SYNCED, kwargs={"pattern": "agnostic"}),
                 summary="build on the CPU, let one helper pick cuda:LOCAL_RANK or cpu, move once, "
                         "pass device_ids only for CUDA"),
        Scenario("meta_to", "A module built on meta, moved with .to()",
                 broken=_materialise("to", Expect("error", "NotImplementedError",
                                                  r"Cannot copy out of meta tensor", ranks=(0, 1))),
                 fixed=_materialise("init", FINITE),
                 summary="meta tensors hold no data: materialise with to_empty(), then initialise"),
        Scenario("meta_forgot_init", "to_empty() and reset_parameters(), a buffer forgotten",
                 broken=_materialise("reset_parameters", Expect(
                     "ok", metric="nonfinite_tensors", above=0.5)),
                 fixed=_materialise("init", FINITE),
                 summary="to_empty() leaves every tensor uninitialised, buffers too; the "
                         "sub-modules' reset_parameters() misses the module's own buffers"),
    ],
)
