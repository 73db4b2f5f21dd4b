"""Lesson 10 beyond the registry's declarations: all-reduce counts against k, bytes, gradients
identical with and without no_sync, the loss-scaling factor, the exercise checker, the figure."""
from __future__ import annotations

import pytest

from conftest import scenario_run

from ddp_lab import launch
from ddp_lab.course import exercise
from ddp_lab.lessons import l10_gradient_accumulation as l10

LESSON = l10.LESSON


@pytest.fixture(scope="module")
def runs():
    return {s.name: {w: scenario_run(s, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}


def test_no_sync_cuts_allreduces_and_bytes_by_k(runs):
    broken = runs["no_sync"]["broken"].raise_for_status().values
    fixed = runs["no_sync"]["fixed"].raise_for_status().values
    k, steps = l10.K, len(broken[0]["allreduces_per_step"])
    for b, f in zip(broken, fixed):  # every rank launches the same all-reduces
        assert b["allreduces_per_step"] == [k] * steps
        assert f["allreduces_per_step"] == [1] * steps
        assert b["bytes_per_step"] == [k * f["bytes_per_step"][0]] * steps
    params = sum(p.numel() for p in l10.Net().parameters())
    assert fixed[0]["bytes_per_step"][0] == params * 4  # one float32 bucket holds every gradient


def test_no_sync_gives_the_same_weights(runs):
    """Same gradients, so the same weights after every step, up to float32 rounding."""
    a = runs["no_sync"]["broken"].values[0]["params"]
    b = runs["no_sync"]["fixed"].values[0]["params"]
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-6
    for run in (runs["no_sync"]["broken"], runs["no_sync"]["fixed"]):
        assert run.values[0]["grad_error"] < l10.GRAD_TOLERANCE


@pytest.mark.parametrize("k", [2, 8])
def test_allreduce_count_follows_k(k):
    b = launch(l10.accumulate_and_step, k=k, steps=2, micro_batch=2).raise_for_status()
    f = launch(l10.accumulate_and_step, k=k, steps=2, micro_batch=2,
               backward=l10.backward_with_no_sync).raise_for_status()
    assert b.values[0]["allreduces_per_step"] == [k, k]
    assert f.values[0]["allreduces_per_step"] == [1, 1]


def test_summed_losses_give_k_times_the_gradient(runs):
    errors = runs["loss_scaling"]["broken"].values[0]["grad_error_per_step"]
    assert errors == pytest.approx([l10.K - 1] * len(errors), rel=1e-4)


def test_exercise_checker_rejects_a_step_that_never_synchronises():
    def everything_in_no_sync(model, micro_batches):
        import torch.nn.functional as F

        with model.no_sync():
            for x, y in micro_batches:
                (F.mse_loss(model(x), y) / len(micro_batches)).backward()

    verdict = exercise.try_fix(LESSON.scenario("no_sync"), backward=everything_in_no_sync)
    assert not verdict.passed
    assert any("never averaged" in p for p in verdict.problems)
    assert any("large-batch reference" in p for p in verdict.problems)
    assert exercise.try_fix(LESSON.scenario("no_sync"), backward=l10.backward_with_no_sync).passed


def test_figure_has_labelled_axes(runs):
    fig = LESSON.figures(runs)["allreduces_per_step"]
    axes = fig.get_axes()
    assert len(axes) == 3
    for ax in axes:
        assert ax.get_xlabel() == "optimiser step" and ax.get_ylabel()
        assert ax.get_legend() is not None
    heights = [p.get_height() for p in axes[0].patches]
    assert sorted(set(heights)) == [1, l10.K]
