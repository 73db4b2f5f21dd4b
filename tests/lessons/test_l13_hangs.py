"""Lesson 13 beyond the registry's declarations: what each hang's report says (stacks, the
flight recorder's parting point, PyTorch's own messages), DETAIL where it applies on this
build, the early-stopping decision and the figure. The runs are shared with test_registry."""
from __future__ import annotations

import pytest

from ddp_lab import launch
from ddp_lab.launching import divergence
from ddp_lab.lessons import l13_hangs as l13
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("13")
pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_rank0_evaluation_parts_at_the_buffer_broadcast(runs):
    result = runs("rank0_evaluation", "broken")
    p = divergence.find(result.ranks)
    assert (p.entries[0].op, p.entries[1].op, p.analyser) == ("broadcast", "barrier",
                                                             "COLLECTIVE_TYPE_MISMATCH")
    assert "_sync_buffers" in result.ranks[0].stack_text(8)
    assert f"rank 1 entered barrier #{p.seq}" in repr(result)
    fixed = runs("rank0_evaluation", "fixed")
    assert 0.0 <= fixed.values[0]["accuracy"] <= 1.0 and fixed.values[1]["accuracy"] is None


def test_slow_save_rank1_times_out_while_rank0_saves(runs):
    result = runs("slow_rank0_save", "broken")
    assert f"Timed out waiting {l13.PG_TIMEOUT * 1000:.0f}ms" in result.ranks[1].error.message
    # gloo's own timeout is the cause, headlined as such, not "lost its connection to a peer"
    assert not result.ranks[1].is_collateral and result.ranks[0].is_collateral
    assert "Timed out waiting" in result.ranks[1].headline
    assert l13.entry_gap(result) > l13.SAVE - l13.PG_TIMEOUT
    assert l13.entry_gap(runs("slow_rank0_save", "fixed")) < l13.PG_TIMEOUT


def test_early_stopping_decided_per_rank_differs_and_agreed_does_not(runs):
    stops = [next(s for s in range(10) if l13.local_loss(s, r) < 0.3) for r in (0, 1)]
    assert stops == [2, 3]  # rank 0 would stop after step 3, rank 1 after step 4
    assert "barrier" in runs("uneven_steps", "broken").ranks[0].stuck_in()
    assert [v["steps"] for v in runs("uneven_steps", "fixed").values] == [3, 3]
    assert l13.parts_at("size", ("barrier", "all_reduce"))(runs("uneven_steps", "broken"))


def test_mismatched_broadcast_keeps_stale_values_on_rank1(runs):
    result = runs("mismatched_broadcast", "broken")
    assert result.values[1]["vocab"] == [0.0, 1.0, 2.0, 3.0, -1.0, -1.0, -1.0, -1.0]
    assert "[8] float32" in divergence.describe(result.ranks)


@pytest.mark.parametrize("name, says", [("uneven_steps", "Op type: BARRIERvs"),
                                        ("mismatched_broadcast", "Tensor shapes: 4vs 8")])
def test_detail_at_group_creation_names_the_mismatch(name, says):
    variant = LESSON.scenario(name).broken
    result = launch(variant.fn, timeout=20, env=l13.DETAIL, **variant.kwargs)
    assert result.ranks[0].status == "error"
    assert "Detected mismatch between collectives on ranks" in result.ranks[0].error.message
    assert says in result.ranks[0].error.message


def test_figure_marks_where_the_ranks_part(runs):
    results = {s.name: {w: runs(s.name, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}
    fig = LESSON.figures(results)["collective_timelines"]
    axes = fig.axes
    assert len(axes) == 8
    dashed = [any(line.get_linestyle() == "--" for line in ax.lines) for ax in axes]
    assert dashed == [True, False, False, False, True, False, True, False]
    assert all(ax.get_xlabel() for ax in axes)
