"""Lesson 09 beyond the registry's declarations: who wrote and whose state survived, where the
checkpoint lives, the other fixes (prefix helper, every load strategy), the exercise checker,
the figure."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch

from ddp_lab import launch
from ddp_lab.course import exercise
from ddp_lab.lessons import l09_saving_and_loading as l09
from conftest import scenario_run  # one run a session, a notebook's where it made it


LESSON = l09.LESSON


def _ckpt_dirs() -> set[str]:
    return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("ddp-lab-ckpt-")}


@pytest.fixture(scope="module")
def runs():
    """Every scenario, broken and fixed, run once for this module."""
    before = _ckpt_dirs()
    out = {s.name: {w: scenario_run(s, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}
    out["_leftover_dirs"] = _ckpt_dirs() - before
    return out


def test_temporary_checkpoint_directories_are_removed(runs):
    assert runs["_leftover_dirs"] == set()


def test_every_rank_writes_loses_a_state(runs):
    broken, fixed = runs["every_rank_writes"]["broken"], runs["every_rank_writes"]["fixed"]
    b = [r.value for r in broken.ranks]
    assert all(v["writers"] == [0, 1] for v in b)
    assert b[0]["distinct_states_written"] == 2  # BatchNorm statistics differ between ranks
    assert b[0]["overwritten"] >= 1
    # after the barrier both ranks read the same bytes: whichever state survived, they agree
    assert b[0]["checksum"] == b[1]["checksum"] and b[0]["holds"] == b[1]["holds"]
    assert b[0]["holds"] in ("rank 0's state", "rank 1's state", "a mix of states")
    f = [r.value for r in fixed.ranks]
    assert all(v["writers"] == [0] and v["overwritten"] == 0 and v["is_checkpoint"] for v in f)


def test_prefix_error_names_both_key_sets_on_every_rank(runs):
    broken = runs["module_prefix"]["broken"]
    for r in broken.ranks:
        assert r.error.type == "RuntimeError"
        assert r.error.first_line == "Error(s) in loading state_dict for Net:"
        assert '"fc2.bias"' in r.error.message and '"module.fc2.bias"' in r.error.message
    assert runs["module_prefix"]["fixed"].values[0]["keys"] == ["fc1.weight", "fc1.bias"]


def test_prefix_stripped_by_pytorch_helper():
    """The other fix: keep the prefixed checkpoint, strip `module.` when loading."""
    scenario = LESSON.scenario("module_prefix")
    result = scenario.broken.with_kwargs(load=l09.load_stripping_prefix).run()
    scenario.fixed.expect.assert_met(result)
    assert result.values[0]["keys"] == ["fc1.weight", "fc1.bias"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the load succeeds onto cuda:0")
def test_gpu_checkpoint_without_map_location_fails_on_cpu(runs):
    broken = runs["map_location"]["broken"]
    assert [r.error.type for r in broken.ranks] == ["RuntimeError", "RuntimeError"]
    assert all("map_location=torch.device('cpu')" in r.error.message for r in broken.ranks)
    fixed = runs["map_location"]["fixed"].values
    assert [v["devices"] for v in fixed] == [["cpu"], ["cpu"]]
    assert [v["recorded"] for v in fixed] == [["cuda:0"], ["cuda:0"]]  # what the file says


def test_which_ranks_hold_which_weights(runs):
    """Rank 0 loading after wrapping is the broken order; before wrapping, the fixed one."""
    late, on_time = runs["load_order"]["broken"], runs["load_order"]["fixed"]
    assert [v["holds"] for v in late.values] == ["rank 0's state", "initial weights"]
    assert late.values[0]["drift"] > 1e-3
    assert [v["holds"] for v in on_time.values] == ["rank 0's state"] * 2
    assert on_time.values[0]["drift"] == 0.0


@pytest.mark.parametrize("resume", [l09.resume_every_rank_after_wrap,
                                    l09.resume_every_rank_before_wrap])
def test_loading_on_every_rank_works_in_either_order(resume):
    result = launch(l09.resume_and_train, resume=resume).raise_for_status()
    assert [v["holds"] for v in result.values] == ["rank 0's state"] * 2
    assert result.values[0]["drift"] == 0.0


def test_checkpoint_goes_where_the_caller_says(tmp_path):
    result = launch(l09.checkpoint_and_reload, save=l09.save_on_rank0, ckpt_dir=str(tmp_path))
    result.raise_for_status()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]  # the caller's directory is kept
    net = l09.Net()
    net.load_state_dict(torch.load(tmp_path / "checkpoint.pt"))
    assert l09.checksum(net.state_dict()) == pytest.approx(result.values[0]["checksum"], abs=1e-9)


def test_exercise_checker_tells_a_wrong_save_from_a_right_one():
    def writes_on_last_rank(model, path):
        import torch.distributed as dist

        if dist.get_rank() == dist.get_world_size() - 1:
            torch.save(model.module.state_dict(), path)

    def writes_on_rank0(model, path):
        import torch.distributed as dist

        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), path)

    scenario = LESSON.scenario("every_rank_writes")
    wrong = exercise.try_fix(scenario, save=writes_on_last_rank)
    assert not wrong.passed and any("did not load rank 0's state" in p for p in wrong.problems)
    assert exercise.try_fix(scenario, save=writes_on_rank0).passed


def test_fingerprint_and_checksum():
    a = l09.Net().state_dict()
    b = {k: v.clone() for k, v in a.items()}
    assert l09.fingerprint(a) == l09.fingerprint(b)
    b["fc2.bias"][0] += 1
    assert l09.fingerprint(a) != l09.fingerprint(b)
    assert l09.checksum(b) == pytest.approx(l09.checksum(a) + 1)


def test_figure_has_a_cell_per_rank_and_labelled_axes(runs):
    figs = LESSON.figures({k: v for k, v in runs.items() if not k.startswith("_")})
    fig = figs["checkpoint_checksums"]
    axes = fig.get_axes()
    assert len(axes) == 2
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() == "rank"
        assert len(ax.patches) == 4 * 2  # 4 scenarios x 2 ranks
        texts = [t.get_text() for t in ax.texts]
        assert len(texts) == 8
    broken_texts = " ".join(t.get_text() for t in axes[0].texts)
    assert "initial weights" in broken_texts and "RuntimeError" in broken_texts
