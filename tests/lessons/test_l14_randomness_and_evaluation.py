"""Lesson 14 beyond the registry's declarations: what each measurement is made of (exact counts
from seeded draws), the modules in one process, the checker and the pictures. Runs are shared
with tests/course/test_registry.py through the `runs` fixture."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l14_randomness_and_evaluation as l14
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("14")


# --- one process ----------------------------------------------------------------------------

def test_shuffled_net_draws_its_order_from_global_random_unless_seeded():
    random.seed(3)
    a = l14.ShuffledNet().order
    random.seed(4)
    b = l14.ShuffledNet().order
    assert sorted(a) == list(range(8)) and a != b
    state = random.getstate()
    assert l14.ShuffledNet(seed=0).order == l14.ShuffledNet(seed=0).order
    assert random.getstate() == state  # its own generator leaves the global one alone


def test_dataset_generator_is_copied_into_every_worker():
    offsets = [int(o) for _, o in DataLoader(l14.RandomCrops(8), batch_size=1, num_workers=2,
                                             multiprocessing_context="fork")]
    assert len(set(offsets)) == 4  # two workers, the same 4 draws each


def test_eval_set_has_exact_logits_and_7_of_9_right():
    x, y, w = l14.eval_set()
    logits = x @ w.T
    assert torch.equal(logits, logits.round())
    top2 = logits.topk(2, dim=1).values
    assert bool((top2[:, 0] > top2[:, 1]).all())  # no ties: argmax is the same on any CPU
    assert sum(l14.correct_on(list(range(l14.EVAL_SIZE)))) == 7


def test_evaluate_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="unknown method 'median'"):
        l14.evaluate("median")


# --- on real ranks ---------------------------------------------------------------------------

def test_one_seed_repeats_masks_and_batches_and_seed_plus_rank_does_not(runs):
    broken, fixed = runs("same_seed", "broken").values[0], runs("same_seed", "fixed").values[0]
    assert (broken["same_masks"], broken["same_batches"]) == (12, 12)
    assert (fixed["same_masks"], fixed["same_batches"]) == (0, 0)


def test_random_choice_builds_different_networks_on_the_ranks(runs):
    broken = runs("random_choice", "broken")
    orders = broken.values[0]["orders"]
    assert orders[0] != orders[1] and broken.values[0]["order_differs"] == 8
    fixed = runs("random_choice", "fixed").values[0]
    assert fixed["orders"][0] == fixed["orders"][1] and fixed["divergence"] == 0.0


def test_workers_repeat_one_sequence_eight_times_until_reseeded(runs):
    broken = runs("worker_seeds", "broken").values[0]
    assert (broken["draws"], broken["repeats"]) == (32, 28)  # 4 distinct offsets: 8 copies
    fixed = runs("worker_seeds", "fixed")
    assert fixed.values[0]["repeats"] == 0
    # every rank saw each of its samples once per epoch: the sampler's shard, twice
    for value in fixed.values:
        assert len(value["seen"]) == 16 and len({(e, i) for e, i, _ in value["seen"]}) == 16


def test_padding_counts_sample_0_twice_and_the_fixes_do_not(runs):
    v = runs("padded_eval", "broken").values
    assert v[1]["padded_shard"] == [1, 3, 5, 7, 0]
    acc, counted = v[0]["accuracy"], v[0]["counted"]
    assert acc["one_process"] == acc["gather"] == acc["sum_count"] == 7 / 9
    assert acc["mean_of_ranks"] == pytest.approx(0.7) and acc["drop_last"] == 0.75
    assert counted == {"gather": 9, "sum_count": 9, "drop_last": 8}
    assert runs("padded_eval", "fixed").values[0]["error"] == 0.0


def test_rank0_loss_is_its_own_shards(runs):
    broken = runs("rank0_loss", "broken")
    v0, v1 = broken.values
    assert v0["logged"] == v0["local"] and v0["all_reduced"] == v1["all_reduced"]
    for a, b, g in zip(v0["local"], v1["local"], v0["global"]):
        assert (a + b) / 2 == pytest.approx(g, rel=1e-5)  # equal shards: the global loss
    assert runs("rank0_loss", "fixed").values[0]["logged"] == v0["all_reduced"]


def test_per_rank_normaliser_weighs_the_emptier_ranks_tokens_more(runs):
    broken = runs("per_rank_normaliser", "broken").values[0]
    assert broken["tokens"] == [29, 10]
    assert runs("per_rank_normaliser", "fixed").values[0]["tokens"] == [29, 10]


def test_checker_fails_a_worker_init_that_does_nothing_and_passes_the_fix():
    scenario = LESSON.scenario("worker_seeds")
    assert not try_fix(scenario, worker_init_fn=lambda worker_id: None).passed
    assert try_fix(scenario, worker_init_fn=l14.reseed_worker).passed


def test_figures_have_one_panel_per_bug(runs):
    results = {s.name: {w: runs(s.name, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}
    figures = LESSON.figures(results)
    assert set(figures) == {"errors_broken_vs_fixed", "logged_loss"}
    axes = figures["errors_broken_vs_fixed"].axes
    assert len(axes) == 6 and all(ax.get_ylabel() for ax in axes)
    assert all(len(ax.patches) >= 2 for ax in axes)
