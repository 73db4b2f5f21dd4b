"""Lesson 04 beyond the registry's declarations: what each precision measures (zero-gradient
fraction, final loss, the scaler's skipped steps and norms), the lost updates of bfloat16
weights, the real FutureWarnings of torch.cuda.amp, ZeRO's shards, the figure and the checker.

Every run here is real: ranks are separate processes with a gloo process group."""
from __future__ import annotations

import math

import pytest

import torch

from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l04_mixed_precision as l04
from ddp_lab.lessons.l04_mixed_precision import modules as m
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("04")


# In this process: what autocast does to the custom Function ----------------------------------
def test_custom_function_fails_in_backward_not_forward():
    model = m.CustomOpNet()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(m.example_batch(0))  # autocast casts the forward's matmul: no error yet
    with pytest.raises(RuntimeError, match=l04.DTYPE_MISMATCH):
        out.float().pow(2).mean().backward()  # backward runs outside autocast


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_custom_fwd_runs_the_function_in_float32_under_either_autocast(dtype):
    model = m.CustomOpNetFixed()
    with torch.autocast("cpu", dtype=dtype):
        hidden = model.body(m.example_batch(0))
        out = model(m.example_batch(0))
    assert hidden.dtype == dtype and out.dtype == torch.float32
    out.pow(2).mean().backward()
    assert model.weight.grad.dtype == torch.float32


def test_float16_has_a_smallest_step_bfloat16_does_not_share():
    tiny = torch.tensor([2e-8, 1e-9])
    assert torch.equal(tiny.half().float(), torch.zeros(2))  # below half of 2**-24: gone
    assert (tiny.bfloat16().float() > 0).all()  # bfloat16 keeps float32's exponent range


# The underflow scenario: measured against thresholds ------------------------------------------
def test_float16_without_scaler_zeroes_most_gradients_and_stalls(runs):
    per_run = runs("fp16_underflow", "broken").ranks[0].value["runs"]
    fp32, bf16, fp16 = per_run["fp32"], per_run["bf16"], per_run["fp16"]
    assert fp16["zero_grad_fraction"] > 0.5
    assert fp32["zero_grad_fraction"] < 0.01 and bf16["zero_grad_fraction"] < 0.01
    assert fp16["final_loss"] > 3 * fp32["final_loss"]  # measured ~9x: stalled on a plateau
    assert bf16["final_loss"] < 1.5 * fp32["final_loss"]  # bfloat16 needs no scaler
    early = sum(fp16["zero_fraction"][1:11]) / 10  # measured ~0.12
    assert fp16["zero_fraction"][-1] > 3 * early  # ~0.85: worse as the loss shrinks


def test_grad_scaler_recovers_float32_training(runs):
    fp32 = runs("fp16_underflow", "broken").ranks[0].value["runs"]["fp32"]
    scaled = runs("fp16_underflow", "fixed").values
    assert max(v["zero_grad_fraction"] for v in scaled) < 0.01
    assert scaled[0]["final_loss"] < 2 * fp32["final_loss"]  # rank 0's data on both sides


def test_grad_scaler_grows_skips_on_overflow_and_backs_off(runs):
    v = runs("fp16_underflow", "fixed").ranks[0].value
    scale, skipped = v["scale"], v["skipped"]
    assert scale[0] == 2.0 ** 16  # the default initial scale
    assert max(scale) >= 2.0 ** 30  # it grew every 2 clean steps
    assert v["skipped_steps"] >= 1
    for step in (s for s in range(len(scale) - 1) if skipped[s]):
        assert not math.isfinite(v["scaled_norm"][step])  # an inf or NaN in the gradients
        assert scale[step + 1] == scale[step] / 2  # halved after the skipped step


def test_clipping_before_unscale_would_see_the_scaled_norm(runs):
    v = runs("fp16_underflow", "fixed").ranks[0].value
    step = 0
    assert v["scaled_norm"][step] == pytest.approx(v["scale"][step] * v["norm"][step], rel=1e-3)
    assert v["norm"][step] < 1e-3 < 1.0 < v["scaled_norm"][step] * 1e3


# Modules that choose their own dtypes -------------------------------------------------------
def test_bfloat16_weights_lose_most_small_updates():
    result = LESSON.scenario("half_weights").broken.run(evaluate=False)
    assert result.ok
    assert all(v["weight_dtype"] == "torch.bfloat16" for v in result.values)
    assert min(v["frozen_fraction"] for v in result.values) > 0.3  # measured ~0.78


def test_float32_weights_train_every_element(runs):
    assert max(v["frozen_fraction"] for v in runs("half_weights", "fixed").values) == 0.0
    assert all(v["weight_dtype"] == "torch.float32" for v in runs("half_weights", "fixed").values)


def test_buffer_stays_float32_in_the_fixed_module():
    model = m.CentredFeaturesFixed()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(m.example_batch(0))
    assert model.running_mean.dtype == torch.float32 and model.running_mean.abs().sum() > 0
    assert out.dtype == torch.bfloat16


# The source document's framework advice ------------------------------------------------------
def test_torch_cuda_amp_raises_its_future_warnings(runs):
    for rank in runs("deprecated_amp", "broken").ranks:
        messages = [msg for cat, msg in rank.value["warnings"] if cat == "FutureWarning"]
        assert any("torch.cuda.amp.autocast(args...)` is deprecated" in s for s in messages)
        assert any("torch.cuda.amp.GradScaler(args...)` is deprecated" in s for s in messages)
        if not torch.cuda.is_available():
            assert rank.value["out_dtype"] == "torch.float32" and not rank.value["scaler_enabled"]


def test_torch_amp_is_silent_and_casts(runs):
    for rank in runs("deprecated_amp", "fixed").ranks:
        assert rank.value["warnings"] == [] and rank.value["scaler_enabled"]


def test_zero_shards_the_optimizer_state(runs):
    values = runs("zero_state_dict", "fixed").values
    shards = values[0]["shard_bytes"]
    assert len(shards) == 2 and min(shards) > 0
    assert sum(v["shard_fraction"] for v in values) == pytest.approx(1.0)
    assert values[0]["checkpoint_bytes"] > sum(shards)  # the consolidated state: every shard
    assert values[0]["drift"] < 1e-6


# The figure and the exercise checker ---------------------------------------------------------
def test_figure_has_labelled_axes_and_every_precision(runs):
    results = {"fp16_underflow": {w: runs("fp16_underflow", w) for w in ("broken", "fixed")}}
    figs = LESSON.figures(results)
    fig = figs["precision_losses"]
    axes = fig.get_axes()
    assert len(axes) == 3
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    labels = {line.get_label() for line in axes[0].get_lines()}
    assert {"fp32", "bf16", "fp16", "fp16 + GradScaler"} <= labels


def test_exercise_checker_tells_a_fix_from_the_bug():
    scenario = LESSON.scenario("custom_function")
    assert try_fix(scenario, model_cls=m.CustomOpNetFixed).passed
    verdict = try_fix(scenario, model_cls=m.CustomOpNet)
    assert not verdict.passed and "RuntimeError" in "".join(verdict.problems)
