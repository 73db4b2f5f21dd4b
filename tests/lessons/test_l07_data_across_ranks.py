"""Lesson 07 beyond the registry's declarations: the helpers that measure overlap and repetition,
the measured step counts, the second fix (even batches), the checker and the picture.

The generic test (tests/course/test_registry.py) runs every scenario broken and fixed against its
declaration; here each distributed test is a public test plus the lesson's per-rank function."""
from __future__ import annotations

import math

import pytest

import ddp_lab
from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l07_data_across_ranks as l07
from ddp_lab.course.registry import get_lesson
from conftest import scenario_run  # one run a session, a notebook's where it made it


LESSON = get_lesson("07")


# --- pure helpers ------------------------------------------------------------------------

def test_data_metrics_on_known_records():
    same = [[[0, 1, 2, 3], [0, 1, 2, 3]], [[0, 1, 2, 3], [0, 1, 2, 3]]]  # [rank][epoch]
    m = l07.data_metrics(same, n=4)
    assert (m["overlap"], m["repeated"], m["coverage"]) == (1.0, 1.0, 1.0)
    split = [[[0, 1], [3, 0]], [[2, 3], [1, 2]]]
    m = l07.data_metrics(split, n=4)
    assert (m["overlap"], m["repeated"], m["coverage"]) == (0.0, 0.0, 1.0)
    half = [[[0, 1], [0, 1]], [[1, 0], [0, 1]]]  # rank 1 reshuffles, rank 0 repeats; 2 of 4 seen
    m = l07.data_metrics(half, n=4)
    assert (m["overlap"], m["repeated"], m["coverage"]) == (1.0, 0.5, 0.5)


def test_seen_matrix_places_each_sample_at_its_step():
    grid = l07.seen_matrix([[[2, 0, 1]], [[3]]], n=4, batch_size=2)  # one epoch, two ranks
    assert grid.shape == (2, 4)
    assert list(grid[0, :3]) == [0, 1, 0] and math.isnan(grid[0, 3])
    assert grid[1, 3] == 0 and all(math.isnan(v) for v in grid[1, :3])


def test_the_filter_rejects_samples_of_one_rank_only():
    ds = l07.IndexedDataset()
    rejected = [i for i in range(len(ds)) if not ds.keep(i)]
    assert rejected == [7, 15, 23, 31] and all(i % 2 == 1 for i in rejected)


# --- measured on real ranks --------------------------------------------------------------

def test_without_a_sampler_each_rank_takes_every_step_of_one_process():
    broken = scenario_run(LESSON.scenario("no_sampler"), "broken")
    fixed = scenario_run(LESSON.scenario("no_sampler"), "fixed")
    assert [v["steps"] for v in broken.values] == [24, 24]  # 3 epochs x 32 samples / 4
    assert [v["steps"] for v in fixed.values] == [12, 12]  # the same epochs, split in two
    assert broken.values[0]["seen"][0] == broken.values[0]["seen"][1]  # rank 0 == rank 1
    assert broken.values[0]["drift"] == 0.0  # DDP kept the weights equal: the bug is silent


def test_without_set_epoch_every_epoch_is_the_first_one():
    result = scenario_run(LESSON.scenario("no_set_epoch"), "broken")
    for rank_record in result.values[0]["seen"]:
        assert rank_record[0] == rank_record[1] == rank_record[2]
    fixed = scenario_run(LESSON.scenario("no_set_epoch"), "fixed")
    assert fixed.values[0]["seen"][0][0] != fixed.values[0]["seen"][0][1]


def test_uneven_inputs_hang_where_the_batch_counts_part():
    scenario = LESSON.scenario("uneven_inputs")
    hang = scenario_run(scenario, "broken")
    assert hang.status == "timeout", hang.describe_failure()
    assert hang.ranks[0].stuck_in() == "_engine_run_backward()"  # DDP's all-reduce, in C++
    assert "in gather" in hang.ranks[1].stack_summary()  # the collective after the loop
    joined = scenario_run(scenario, "fixed")
    assert [v["steps"] for v in joined.values] == [12, 9]  # 4 vs 3 batches per epoch
    assert joined.values[0]["coverage"] == pytest.approx(28 / 32)


def test_even_batches_are_the_other_fix():
    result = ddp_lab.launch(l07.train, batches=l07.even_filtered_batches).raise_for_status()
    steps = [v["steps"] for v in result.values]
    assert steps[0] == steps[1] == 12
    value = result.values[0]
    assert value["overlap"] == 0.0 and value["repeated"] == 0.0 and value["drift"] == 0.0
    assert value["coverage"] == pytest.approx(28 / 32)


def test_checker_rejects_each_broken_pipeline_and_accepts_the_fix():
    for name in ("no_sampler", "no_set_epoch"):
        scenario = LESSON.scenario(name)
        assert try_fix(scenario, batches=l07.distributed_batches).passed
        for broken in (l07.shuffled_batches, l07.sampler_batches_no_set_epoch):
            verdict = try_fix(scenario, batches=broken)
            assert not verdict.passed and verdict.problems, (name, broken.__name__)


def test_the_picture_has_labelled_axes():
    runs = {name: {which: scenario_run(LESSON.scenario(name), which) for which in ("broken", "fixed")}
            for name in ("no_sampler", "no_set_epoch")}
    figures = LESSON.figures(runs)
    fig = figures["samples_seen"]
    heat_maps = [ax for ax in fig.axes if ax.images]
    assert len(heat_maps) == 3
    for ax in heat_maps:
        assert ax.get_xlabel() and ax.get_title() and len(ax.get_yticklabels()) == 6
    colourbar = [ax for ax in fig.axes if not ax.images]
    assert colourbar and colourbar[0].get_ylabel()
