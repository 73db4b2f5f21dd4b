"""Lesson 03 beyond the registry's declarations: the extra variants the notebook runs (no timeout
on init, two rank 0s, the document's barrier, DETAIL, a plain barrier), the timeline read back
from killed ranks, the picture, and the exercise checker.

The generic test (tests/course/test_registry.py) runs every scenario broken and fixed against its
declaration; here each distributed test is a public test plus the lesson's per-rank function."""
from __future__ import annotations

import pytest

from ddp_lab import launch, rank_info
from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l03_process_groups_and_deadlocks as l03
from ddp_lab.course.registry import get_lesson
from conftest import scenario_run  # one run a session, a notebook's where it made it


LESSON = get_lesson("03")
EXTRA = {"INIT_SILENT": l03.INIT_SILENT, "INIT_DUPLICATE_RANK": l03.INIT_DUPLICATE_RANK,
         "WITH_BARRIER": l03.WITH_BARRIER, "MISMATCH_DETAIL": l03.MISMATCH_DETAIL,
         "PLAIN_BARRIER": l03.PLAIN_BARRIER}


def _nothing() -> None:
    return None


@pytest.fixture(scope="module", autouse=True)
def warm_fork_server():
    """A launch's clock starts before a cold fork server is up: start the server first, so the
    3-4 s hangs below time the hang, not the server's start."""
    launch(_nothing, world_size=1, timeout=120).raise_for_status()


@pytest.mark.parametrize("name", EXTRA)
def test_extra_variant_is_as_declared(name, no_leftovers):
    variant = EXTRA[name]
    variant.expect.assert_met(variant.run())


@pytest.fixture(scope="module")
def report_runs():
    scenario = LESSON.scenario("collective_on_rank0")
    return {which: scenario_run(scenario, which) for which in ("broken", "fixed")}


def test_killed_ranks_still_give_their_timeline(report_runs):
    broken = report_runs["broken"]
    done, still_open = l03.spans_from_run(broken)
    assert [[name for name, *_ in spans] for spans in still_open] == [["all_reduce"], ["forward"]]
    for rank, spans in enumerate(still_open):
        (_, start, end), = spans
        assert end - start > 1.0, f"rank {rank} was stopped only {end - start:.2f} s into its wait"
    # Both ranks finished step 0's forward, backward and optimizer step before the hang.
    for spans in done:
        assert [name for name, *_ in spans][:3] == ["forward", "backward", "optimizer step"]


def test_the_fixed_run_all_reduces_on_every_rank_every_step(report_runs):
    done, still_open = l03.spans_from_run(report_runs["fixed"])
    assert still_open == [[], []]
    assert [sum(name == "all_reduce" for name, *_ in spans) for spans in done] == [3, 3]
    for value, spans in zip(report_runs["fixed"].values, done):  # the record matches the value
        assert [n for n, *_ in value["spans"]] == [n for n, *_ in spans]
        assert max(abs(a - b) for (_, *x), (_, *y) in zip(value["spans"], spans)
                   for a, b in zip(x, y)) < 1e-5


def test_timeline_figure_has_labelled_axes(report_runs):
    figs = LESSON.figures({"collective_on_rank0": report_runs})
    (ax_broken, ax_fixed) = figs["collective_timeline"].axes[:2]
    for ax in (ax_broken, ax_fixed):
        assert ax.get_xlabel() == "time since the ranks aligned (s)"
        assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert ax_broken.get_title() == "broken: timeout" and ax_fixed.get_title() == "fixed: ok"
    assert any("still in all_reduce" in t.get_text() for t in ax_broken.texts)


def _report_everywhere_print_everywhere(loss, step):
    import torch.distributed as dist

    dist.all_reduce(loss)
    print(f"step {step}: mean loss {loss.item() / dist.get_world_size():.4f}")


def _report_like_the_fix(loss, step):
    import torch.distributed as dist

    dist.all_reduce(loss)
    if rank_info().rank == 0:
        print(f"step {step}: loss {loss.item() / dist.get_world_size():.4f}")


def test_checker_rejects_printing_on_every_rank_and_accepts_the_fix():
    scenario = LESSON.scenario("collective_on_rank0")
    verdict = try_fix(scenario, report=_report_everywhere_print_everywhere)
    assert not verdict.passed and verdict.problems == ["rank 1 printed 3 lines, expected none"]
    assert try_fix(scenario, report=_report_like_the_fix).passed


def test_per_rank_takes_the_last_entry_past_the_end():
    assert [l03.per_rank((4, 3), r) for r in range(4)] == [4, 3, 3, 3]


def test_evaluate_reference_is_the_mean_of_every_shard():
    import torch

    losses = torch.cat([l03.shard_losses(r, (4, 3)) for r in range(2)])
    assert losses.shape == (7,) and torch.equal(l03.shard_losses(1, (4, 3)), l03.shard_losses(1, (4, 3)))
