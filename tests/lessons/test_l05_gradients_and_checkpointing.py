"""Lesson 05 beyond the registry's declarations: the memory a retain_graph loop piles up per
step, the anomaly report that finds the in-place edit, the second fix of reentrant
checkpointing, what checkpointing saves (bytes and peak memory), the memory probes themselves,
the figure and the checker.

Every run here is real: ranks are separate processes with a gloo process group."""
from __future__ import annotations

import os

import pytest

import torch

from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l05_gradients_and_checkpointing as l05
from ddp_lab.lessons.l05_gradients_and_checkpointing import modules as m
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("05")


# The memory probes, in this process ----------------------------------------------------------
def test_held_bytes_fall_to_zero_after_backward_and_stay_with_retain_graph():
    w = torch.ones(1024, requires_grad=True)
    with l05.held_saved_bytes() as held:
        loss = (torch.tanh(w * torch.randn(1024))).sum()  # saves 2 x 4 KiB
        assert held.bytes == held.saved == 2 * 4096
        loss.backward(retain_graph=True)
        assert held.bytes == 2 * 4096
        loss.backward()
        assert held.bytes == 0 and held.saved == 2 * 4096


def test_peak_growth_sees_a_large_allocation():
    with l05.peak_growth() as peak:
        big = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
        del big
    assert peak.mb > 48
    assert l05.slope([1, 3, 5, 7]) == pytest.approx(2.0) and l05.slope([4, 4, 4]) == 0.0


# Carried state, and what retain_graph=True costs ---------------------------------------------
def test_backward_twice_fails_at_the_second_step(runs):
    result = runs("backward_twice", "broken")
    assert all(r.stdout == "step 0 done\n" for r in result.ranks)  # fails in the second step
    assert "retain_graph=True" in result.ranks[0].error.message  # the hint the document followed


def test_retain_graph_grows_memory_every_step(runs):
    for v in runs("retain_graph", "broken").values:
        held = v["held_mb"]
        assert v["held_growth"] == pytest.approx(1.0, rel=0.05)  # one step's activations: 1 MiB
        assert held[-1] > 25 * held[0] * 0.9 and held[-1] > 25
        assert v["memory_growth"] > 0.5  # the process grows too (measured ~1.3-1.8 MiB/step)


def test_detached_state_holds_nothing_between_steps(runs):
    for v in runs("retain_graph", "fixed").values:
        assert max(v["held_mb"]) == 0.0
        assert v["memory_growth"] < 0.5
        assert v["drift"] < 1e-6


def test_retain_graph_with_weights_fails_on_the_optimizer_update(runs):
    error = runs("retain_graph_weights", "broken").ranks[0].error.message
    assert "is at version" in error and "expected version" in error
    stdout = runs("retain_graph_weights", "broken").ranks[0].stdout
    assert "step 1 done" in stdout and "step 2 done" not in stdout  # step 1's graph saved W


# In-place edits: anomaly detection names the line ---------------------------------------------
def test_anomaly_detection_points_at_the_forward_line():
    result = LESSON.scenario("inplace_saved").broken.run(detect_anomaly=True)
    LESSON.scenario("inplace_saved").assert_declared("broken", result)
    origin = l05.anomaly_origin(result.ranks[0].stderr)
    assert origin.startswith("ExpBackward0 failed")
    assert "weights = torch.exp(self.score(x))" in origin
    assert os.path.basename(m.__file__) in origin and "/work" not in origin
    assert "output 0 of Exp" in result.ranks[0].error.message


# Checkpointing ----------------------------------------------------------------------------------
def test_side_effects_make_wrong_gradients_on_every_rank(runs):
    for name in ("checkpoint_counter", "checkpoint_rng"):
        errors = [v["grad_error"] for v in runs(name, "broken").values]
        assert min(errors) > 1e-3, name
        assert runs(name, "broken").ranks[0].value["drift"] < 1e-6  # wrong, yet in sync


def test_reentrant_checkpointing_fixed_by_static_graph():
    result = l05.STATIC_GRAPH.run()
    l05.STATIC_GRAPH.expect.assert_met(result)
    assert max(v["grad_error"] for v in result.values) < 1e-6


def test_checkpointing_saves_activations_and_peak_memory(runs):
    plain, ckpt = runs("activation_memory", "broken").values, runs("activation_memory", "fixed").values
    depth = plain[0]["saved_by_depth"]
    assert list(depth) == [1, 2, 4, 8]
    assert depth[8] == pytest.approx(8 * depth[1], rel=0.05)  # linear in depth
    assert plain[0]["saved_mb"] > 6 * ckpt[0]["saved_mb"]  # measured 37.4 vs 4.5 MiB
    for p, c in zip(plain, ckpt):
        assert p["peak_exact"] and c["peak_exact"]
        assert p["peak_growth_mb"] > c["peak_growth_mb"] + 10  # measured ~45 vs ~21 MiB


# The figure and the exercise checker ---------------------------------------------------------
def test_figure_has_labelled_axes(runs):
    results = {n: {w: runs(n, w) for w in ("broken", "fixed")}
               for n in ("activation_memory", "retain_graph")}
    fig = LESSON.figures(results)["backward_memory"]
    axes = fig.get_axes()
    assert len(axes) == 3
    for ax in axes:
        assert ax.get_ylabel() and ax.get_title()
    assert axes[0].get_xlabel() and axes[2].get_xlabel()


def test_exercise_checker_tells_a_fix_from_the_bug():
    scenario = LESSON.scenario("inplace_saved")
    assert try_fix(scenario, model_cls=m.AttentionPoolFixed).passed
    assert not try_fix(scenario, model_cls=m.AttentionPool).passed
