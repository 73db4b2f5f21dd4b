"""Lesson 02 beyond the registry's declarations: what each tensor of the module does under
`.to()`, DDP and `state_dict()`, the bfloat16 cast, the document's hard-coded device, what
`to_empty` leaves uninitialised, the figures and the exercise checker.

Every run here is real: ranks are separate processes with a gloo process group."""
from __future__ import annotations

import math

import pytest

import torch
from torch import nn

import ddp_lab
from ddp_lab.course.exercise import try_fix
from ddp_lab.launching.cuda_init import gpu_count
from ddp_lab.lessons import l02_device_and_dtype as l02
from ddp_lab.lessons.l01_parameter_registration import inventory
from ddp_lab.lessons.l02_device_and_dtype import modules as m
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("02")
CPU_ONLY = pytest.mark.skipif(l02.ON_GPUS, reason="on 2 GPUs the plain constants fail as a "
                              "device mismatch instead (declared in the registry)")


def test_to_moves_and_casts_only_registered_tensors():
    broken, fixed = m.RandomFeatures().double(), m.RandomFeaturesFixed().double()
    assert broken.freqs.dtype == broken.phases.dtype == torch.float32
    assert broken.out.weight.dtype == torch.float64
    assert {t.dtype for t in [*fixed.parameters(), *fixed.buffers()]} == {torch.float64}
    how = {r["name"]: r["how"] for r in inventory.table(fixed)}
    assert how["freqs"] == inventory.BUFFER and how["phases"] == inventory.BUFFER_NOT_SAVED


def test_both_modules_compute_the_same_function_in_float32():
    torch.manual_seed(0)
    broken = m.RandomFeatures()
    torch.manual_seed(0)
    fixed = m.RandomFeaturesFixed()
    x = m.example_batch(m.RandomFeatures, 0)
    assert torch.equal(broken(x), fixed(x))  # the fix changes registration, not the maths
    torch.manual_seed(0)
    rnn = m.TinyRNN()
    torch.manual_seed(0)
    rnn_fixed = m.TinyRNNFixed()
    seq = m.example_batch(m.TinyRNN, 0)
    assert torch.equal(rnn(seq), rnn_fixed(seq))


@CPU_ONLY
def test_plain_constants_stay_apart_and_out_of_the_state_dict(runs):
    broken, fixed = runs("constant_across_ranks", "broken"), runs("constant_across_ranks", "fixed")
    b, f = broken.ranks[0].value, fixed.ranks[0].value
    assert min(b["tensor_drift_per_step"]["freqs"]) > 1e-3  # never broadcast
    assert max(b["tensor_drift_per_step"]["phases"]) == 0.0  # same on every rank: computed
    assert max(b["tensor_drift_per_step"]["out.weight"]) == 0.0
    assert min(b["output_gap_per_step"]) > 1e-3 and max(f["output_gap_per_step"]) == 0.0
    assert b["state_dict"] == ["out.bias", "out.weight"]
    assert f["state_dict"] == ["freqs", "out.bias", "out.weight"]  # phases: persistent=False
    after_double = {r["name"]: r["dtype_after_double"] for r in b["map"]}
    assert after_double == {"out.weight": "float64", "out.bias": "float64", "freqs": "float32",
                            "phases": "float32"}
    assert {r["dtype_after_double"] for r in f["map"]} == {"float64"}


def test_bfloat16_cast_fails_the_same_way():
    result = l02.TO_BFLOAT16.run()
    l02.TO_BFLOAT16.expect.assert_met(result)
    assert "BFloat16" in result.ranks[0].error.message or "device" in result.ranks[0].error.message
    fixed = LESSON.scenario("constant_cast").fixed.with_kwargs(dtype="bfloat16").run()
    assert fixed.ok, fixed.describe_failure()


def test_forward_tensor_fix_follows_the_cast(runs):
    result = runs("forward_tensor", "fixed")
    losses = result.ranks[0].value["losses"]
    assert all(math.isfinite(x) for x in losses)
    assert {r["dtype"] for r in result.ranks[0].value["tensors"]} == {"float64"}


@pytest.mark.skipif(gpu_count() > 0, reason="shows the failure on a machine without a GPU")
def test_hardcoded_cuda_fails_without_a_gpu():
    """Each build its own error: the CPU build has no CUDA; the CUDA build finds no driver (and
    never 'Cannot re-initialize CUDA in forked subprocess': the fork server is clean)."""
    result = l02.NO_GPU_FOR_HARDCODED.assert_met(ddp_lab.launch(l02.hardcoded_cuda, grace=2))
    err = result.root_cause.error
    if torch.cuda._is_compiled():
        assert (err.type, err.first_line) == ("RuntimeError", "Found no NVIDIA driver on your "
                                              "system. Please check that you have an NVIDIA GPU "
                                              "and installed a driver from "
                                              "http://www.nvidia.com/Download/index.aspx")
    else:
        assert (err.type, err.message) == ("AssertionError", "Torch not compiled with CUDA enabled")


def test_agnostic_wrap_picks_the_device_helper(runs):
    value = runs("device_ids_on_cpu", "fixed").ranks[1].value
    assert value["device"] == str(ddp_lab.device()) or value["device"].startswith("cuda")


def test_to_empty_leaves_every_tensor_uninitialised():
    result = l02.NO_INIT.run()
    l02.NO_INIT.expect.assert_met(result)
    value = result.ranks[0].value
    assert sorted(value["nonfinite"]) == sorted(["lin.weight", "lin.bias", "head.weight",
                                                 "head.bias", "positions"])
    assert all(math.isnan(x) for x in value["losses"])


def test_reset_parameters_misses_only_the_buffer(runs):
    broken, fixed = runs("meta_forgot_init", "broken"), runs("meta_forgot_init", "fixed")
    assert broken.ranks[0].value["nonfinite"] == ["positions"]
    assert all(math.isnan(x) for x in broken.ranks[1].value["losses"])
    assert fixed.ranks[0].value["nonfinite"] == []
    assert all(math.isfinite(x) for x in fixed.ranks[0].value["losses"])


def test_module_is_built_on_meta_then_materialised(runs):
    value = runs("meta_forgot_init", "fixed").ranks[1].value
    assert value["built_on"] == ["meta"]
    assert value["devices"] == [str(ddp_lab.device())]


@CPU_ONLY
def test_figures_have_labelled_axes(runs):
    results = {"constant_across_ranks": {w: runs("constant_across_ranks", w)
                                         for w in ("broken", "fixed")}}
    figs = LESSON.figures(results)
    assert set(figs) == {"tensor_map", "constant_drift"}
    for fig in figs.values():
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_title()
    map_ax = figs["tensor_map"].axes[0]
    labels = [t.get_text() for t in map_ax.get_yticklabels()]
    assert any("freqs" in t and "plain tensor attribute" in t for t in labels)
    cells = [t.get_text() for t in map_ax.texts]
    assert any("≠ rank 0" in c for c in cells) and any("float32" in c for c in cells)
    drift_ax = figs["constant_drift"].axes[0]
    assert drift_ax.get_ylabel()
    assert "freqs (plain)" in [line.get_label() for line in drift_ax.get_lines()]


class Smoother(nn.Module):
    """The exercise's module: a fixed smoothing kernel and a running state made in forward."""

    input_shape = (16, 8)

    def __init__(self):
        super().__init__()
        self.kernel = torch.randn(8, 8) / 8
        self.out = nn.Linear(8, 1)

    def forward(self, x):
        acc = torch.zeros(x.shape[0], 8)
        return self.out(acc + x @ self.kernel)


class SmootherFixed(Smoother):
    def __init__(self):
        super().__init__()
        self.register_buffer("kernel", self.__dict__.pop("kernel"))

    def forward(self, x):
        return self.out(x.new_zeros(x.shape[0], 8) + x @ self.kernel)


def test_exercise_checker_tells_a_fix_from_the_bug():
    for name in ("constant_cast", "constant_across_ranks"):
        scenario = LESSON.scenario(name)
        assert not try_fix(scenario, model_cls=Smoother).passed
        verdict = try_fix(scenario, model_cls=SmootherFixed)
        assert verdict.passed, verdict.problems
