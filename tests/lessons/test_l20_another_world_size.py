"""Lesson 20 beyond the registry's declarations: the loop's maths in one process, what each
launcher passes, where a resumed job lands at each world size, the accumulation rule, the checker
and the pictures.

The generic test (tests/course/test_registry.py) runs every scenario broken and fixed against its
declaration; the runs here are shared with it through the `runs` fixture."""
from __future__ import annotations

import pytest

from ddp_lab.course.exercise import try_fix
from ddp_lab.course.registry import get_lesson
from ddp_lab.lessons import l20_another_world_size as l20

LESSON = get_lesson("20")


# --- one process ----------------------------------------------------------------------------

def test_the_sampler_shuffles_one_order_at_every_world_size():
    """torch/utils/data/distributed.py:110-112 and :134: one permutation, rank r takes every
    world-th index from r; so the ranks' first k batches together are the order's first samples."""
    whole = l20.my_indices(1, 0)
    for world in (2, 4):
        shards = [l20.my_indices(world, r) for r in range(world)]
        assert sorted(i for s in shards for i in s) == list(range(l20.SAMPLES))
        first = [i for s in shards for i in s[:3 * 16 // world]]
        assert sorted(first) == sorted(whole[:48])


def test_the_single_process_learns():
    curve = l20.single_process()
    assert len(curve) == l20.SAMPLES // l20.GLOBAL_BATCH
    assert curve[-1] < 0.2 * curve[0]


def test_accumulation_steps_keep_the_global_batch_and_refuse_what_cannot():
    assert [l20.accumulation_steps(16, 4, w) for w in (1, 2, 4)] == [4, 2, 1]
    assert [l20.tuned_on_one_process(16, 4, w) for w in (1, 2, 4)] == [4, 4, 4]
    for world in (3, 8):
        with pytest.raises(ValueError, match="is not 4 x"):
            l20.accumulation_steps(16, 4, world)


def test_the_script_reads_both_spellings_and_the_variable(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert l20.local_rank("both", ["--local-rank=1"]) == 1
    assert l20.local_rank("both", ["--local_rank", "1"]) == 1
    assert l20.local_rank("both", []) == 1  # torchrun: no argument, the variable
    assert l20.local_rank("underscore", []) == 0  # the bug: the default, whatever LOCAL_RANK says
    assert l20.local_rank("env", []) == 1
    with pytest.raises(SystemExit):
        l20.local_rank("underscore", ["--local-rank=1"])


# --- on real ranks ----------------------------------------------------------------------------

def test_a_kept_per_rank_batch_grows_the_global_batch_and_the_loss(runs):
    value = runs("per_rank_batch", "broken").values[0]
    assert value["global_batch"] == {"1": 16, "2": 32, "4": 64}
    assert [len(value["curves"][w]) for w in ("1", "2", "4")] == [16, 8, 4]
    final = value["final"]
    assert final["1"] == value["reference"][-1]  # world 1 is the single process
    assert final["1"] < final["2"] < final["4"]


def test_the_kept_global_batch_is_the_single_process_at_every_step(runs):
    value = runs("per_rank_batch", "fixed").values[0]
    for world in ("2", "4"):
        assert max(abs(a - b) for a, b in zip(value["curves"][world], value["reference"])) < 1e-4


def test_the_linear_rule_is_another_trajectory():
    scaled = LESSON.scenario("per_rank_batch").run("broken", scale_lr=True).raise_for_status()
    value = scaled.values[0]
    ref = value["reference"][-1]
    assert abs(value["final"]["4"] - ref) > 0.02  # not the single process's run
    assert abs(value["final"]["4"] - ref) < 0.5 * ref  # though far closer than without it


def test_the_old_launcher_passes_the_dashed_flag_and_warns(runs):
    broken = runs("old_launcher_flag", "broken")
    assert [w["argv"] for w in l20.workers_of(broken.ranks[0])] == [["--local-rank=0"], ["--local-rank=1"]]
    fixed = runs("old_launcher_flag", "fixed").values[0]
    assert fixed["warned"] == ["FutureWarning: The module torch.distributed.launch is deprecated"]


def test_torchrun_passes_no_argument(runs):
    for which in ("broken", "fixed"):
        value = runs("torchrun_local_rank", which).values[0]
        assert [w["argv"] for w in value["workers"]] == [[], []]
        assert value["env_local_ranks"] == [0, 1] and value["warned"] == []


def test_resuming_the_other_way_skips_samples(runs):
    twice = runs("resume_elsewhere", "broken").values[0]
    assert (twice["twice"], twice["never"]) == (48, 0)
    # the first job's 6 steps x 4 x 4 ranks = 96 samples; the resumed one skips 6 x 4 x 2 = 48
    assert twice["times_in_order"][:48] == [1] * 48 and twice["times_in_order"][48:96] == [2] * 48
    grown = LESSON.scenario("resume_elsewhere").run("broken", first_world=2, world_size=4)
    value = grown.raise_for_status().values[0]
    assert (value["twice"], value["never"]) == (0, 48)
    assert value["times_in_order"][48:96] == [0] * 48
    fixed = LESSON.scenario("resume_elsewhere").run("fixed", first_world=2, world_size=4)
    assert fixed.raise_for_status().values[0]["misplaced"] == 0


def test_accumulation_tuned_on_one_process_doubles_the_batch(runs):
    broken, fixed = runs("accumulation_from_world", "broken"), runs("accumulation_from_world", "fixed")
    assert (broken.values[0]["accum"], broken.values[0]["global_batch"]) == (4, 32)
    assert (fixed.values[0]["accum"], fixed.values[0]["global_batch"]) == (2, 16)
    four = LESSON.scenario("accumulation_from_world").run("fixed", world_size=4).raise_for_status()
    assert four.values[0]["accum"] == 1 and four.values[0]["gap"] < 1e-4


def test_the_checker_tells_the_two_accumulation_rules_apart():
    scenario = LESSON.scenario("accumulation_from_world")
    assert try_fix(scenario, steps_for=l20.accumulation_steps).passed
    assert not try_fix(scenario, steps_for=l20.tuned_on_one_process).passed


def test_the_pictures_have_labelled_axes(runs):
    results = {name: {w: runs(name, w) for w in ("broken", "fixed")}
               for name in ("per_rank_batch", "resume_elsewhere")}
    figures = LESSON.figures(results)
    assert set(figures) == {"loss_at_world_sizes", "resume_order"}
    for fig in figures.values():
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    assert all(len(ax.get_lines()) == 3 for ax in figures["loss_at_world_sizes"].axes)
