"""Lesson 19: drift nobody reports. The scenarios' runs are shared with the registry test (the
`runs` fixture); these tests check what the notebook reads from them, the modules in one
process, the launches the notebook makes beside the scenarios, the checker and the picture."""
import pickle

import pytest
import torch

import ddp_lab
from ddp_lab.course.exercise import try_fix
from ddp_lab.course.registry import get_lesson
from ddp_lab.lessons import l19_drift_nobody_reports as l19

LESSON = get_lesson("19")  # the `runs` fixture reads this name


# --- one process ------------------------------------------------------------------------------

def test_a_cast_keeps_the_parameter_objects_and_a_new_head_does_not():
    # module.py's _apply sets param.data (torch/nn/modules/module.py:994-996): the list DDP made
    # at wrapping still holds every parameter after a cast, so only the digest sees the cast
    model = l19.Net()
    before = [id(p) for p in model.parameters()]
    digest = l19.digest(model)
    l19.change(model, "cast")
    assert [id(p) for p in model.parameters()] == before
    assert {p.dtype for p in model.parameters()} == {torch.float64} and l19.digest(model) != digest
    l19.change(model, "head")
    assert [id(p) for p in model.parameters()][2:] != before[2:]


def test_the_digest_is_equal_for_equal_models_only():
    torch.manual_seed(0)
    a = l19.Net()
    torch.manual_seed(0)
    b = l19.Net()
    assert l19.digest(a) == l19.digest(b)
    with torch.no_grad():
        b.head.bias += 1e-7
    assert l19.digest(a) != l19.digest(b)


def test_predictions_differ_in_length_by_rank_and_step():
    assert [l19.predictions(r, s).numel() for r in (0, 1) for s in (0, 1)] == [3, 4, 4, 5]


# --- on real ranks ----------------------------------------------------------------------------

def test_a_cast_after_wrapping_drifts_from_the_first_step_and_ddp_still_knows_every_parameter(runs):
    broken, fixed = runs("cast_after_wrapping", "broken"), runs("cast_after_wrapping", "fixed")
    b, f = broken.values[0], fixed.values[0]
    assert b["dtype"] == f["dtype"] == "float64"
    assert min(b["drift_per_step"]) > 1e-2 and b["unregistered"] == []  # the registration looks fine
    assert not any(b["digests_agree"]) and all(f["digests_agree"])
    assert min(b["grad_gap_per_step"]) > 0.1 and f["grad_gap_per_step"] == [0.0] * 4  # never averaged
    assert f["drift_per_step"] == [0.0] * 4


def test_a_head_replaced_after_wrapping_is_unknown_to_ddp(runs):
    silent = runs("head_after_wrapping", "broken")
    loud = runs("head_after_wrapping_default", "broken")
    assert silent.values[0]["unregistered"] == ["head.weight", "head.bias"]
    assert min(silent.values[0]["drift_per_step"]) > 1e-2
    for r in loud.ranks:  # the old head's parameters are the ones without a gradient: 2 and 3
        assert "Parameter indices which did not receive grad for rank" in r.error.message
        assert ": 2 3" in r.error.message


def test_phase_2_without_the_wrapper_averages_no_gradient(runs):
    broken, fixed = runs("wrapped_some_phases", "broken"), runs("wrapped_some_phases", "fixed")
    b, n = broken.values[0], broken.values[0]["phase_steps"]
    assert b["grad_gap_per_step"][:n] == [0.0] * n and min(b["grad_gap_per_step"][n:]) > 0.1
    assert b["drift_per_step"][:n] == [0.0] * n and min(b["drift_per_step"][n:]) > 1e-2
    assert max(fixed.values[0]["grad_gap_per_step"]) < 1e-6


def test_watch_sees_the_phase_that_skips_the_wrapper():
    report = ddp_lab.watch(l19.step_through, l19.Net, l19.watch_batches, steps=3, timeout=60)
    codes = {f.code for f in report.findings}
    assert "parameters-differ-after-step" in codes, codes
    finding = next(f for f in report.findings if f.code == "parameters-differ-after-step")
    assert "after step 2" in finding.title  # steps 0 and 1 went through the wrapper


def test_clip_factors_differ_by_rank_only_with_the_local_norm(runs):
    local, whole = runs("clip_local_norm", "broken"), runs("clip_local_norm", "fixed")
    kinds, placements = local.values[0]["kinds"], local.values[0]["placements"]
    assert kinds["up.weight"] == "DTensor" and kinds["norm.weight"] == "Parameter"
    # RowwiseParallel leaves down's bias whole: a Replicate DTensor, not a shard
    # (torch/distributed/tensor/parallel/style.py:266-277), what the exercise's text says
    assert placements == {"up.weight": "S(0)", "up.bias": "S(0)", "down.weight": "S(1)",
                          "down.bias": "R"}
    a, b = (v["factors"] for v in local.values)
    assert all(f < 1 for f in a + b) and a != b  # every step clips, by a factor of its own
    assert whole.values[0]["factors"] == whole.values[1]["factors"]
    for v in whole.values:  # the fix's norm is the whole gradient's, computed another way
        assert all(abs(n - w) <= 1e-9 * w for n, w in zip(v["norms"], v["whole_norms"]))
    mixed = runs("clip_mixed_dtensor", "broken")
    assert "_foreach_norm" in mixed.ranks[0].error.message


def test_uneven_all_gather_aborts_rank_0_and_rank_1_never_gets_rank_0_s_predictions(runs):
    broken = runs("uneven_all_gather", "broken")
    r1 = broken.ranks[1]
    # gloo's: rank 1 either returns with a slot sized by its own length, or loses its peer
    assert (r1.ok and r1.value["rank0_slot"][0] != l19.predictions(0, 0).tolist()) or r1.status == "error"
    fixed = runs("uneven_all_gather", "fixed")
    assert fixed.values[1]["rank0_slot"] == [l19.predictions(0, s).tolist() for s in range(3)]


def test_all_gather_object_is_exact_and_pickles():
    objects = ddp_lab.launch(l19.gather_on_gloo, how="objects", init_process_group=False)
    objects.raise_for_status()
    assert all(v["error"] == 0 for v in objects.values)
    v = objects.values[0]
    assert v["pickled_bytes"] > 10 * v["raw_bytes"]  # a pickled tensor carries its metadata
    assert v["raw_bytes"] == 12 and len(pickle.dumps(l19.predictions(0, 0))) == v["pickled_bytes"]


def test_the_early_read_is_rank_0_s_own_value(runs):
    broken = runs("read_before_wait", "broken")
    # rank 0 read its own (1 + step) where the sum is (1 + step) + (2 + step): 2 + step apart
    assert broken.values[0]["error_per_step"] == [2.0 + s for s in range(5)]
    assert broken.values[1]["error"] == 0.0


def test_the_checker_accepts_the_wait_and_rejects_the_early_read():
    scenario = LESSON.scenario("read_before_wait")
    assert try_fix(scenario, fn=l19.read_async_on_gloo, wait_first=True).passed
    assert not try_fix(scenario, fn=l19.read_async_on_gloo, wait_first=False).passed


@pytest.mark.slow
def test_the_picture_has_a_panel_per_scenario_with_labelled_axes(runs):
    names = [p[0] for p in l19.figures.__globals__["PANELS"]]
    results = {n: {w: runs(n, w) for w in ("broken", "fixed")} for n in names}
    fig = LESSON.figures(results)["drift_per_step"]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 6
    for ax in visible:
        assert ax.get_xlabel() == "step (counted from 1)" and ax.get_ylabel() and ax.get_title()
        assert ax.get_lines()


def test_the_checker_rejects_the_local_norm_and_accepts_the_global_one():
    scenario = LESSON.scenario("clip_local_norm")
    assert try_fix(scenario, norm=l19.global_norm).passed
    verdict = try_fix(scenario, norm=l19.local_norm)
    assert not verdict.passed and "drift" in verdict.problems[0]
