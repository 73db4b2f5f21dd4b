"""Lesson 13 beyond the registry's declarations: what each hang's report says (stacks, the
flight recorder's parting point, PyTorch's own messages), DETAIL where it applies on this
build, the early-stopping decision and the figure. The runs are shared with test_registry."""
from __future__ import annotations

import pytest

from dataclasses import replace

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


def test_ddp_syncs_buffers_only_in_a_forward_that_follows_a_grad_enabled_one():
    """require_forward_param_sync (torch/nn/parallel/distributed.py:1781, 1828-1841): the first
    no_grad forward after training broadcasts, the second does not, nor the next training one;
    counted from the flight record (broadcasts of the BatchNorm's 32 running statistics)."""
    counted = launch(l13.buffer_broadcasts_per_forward,
                     ("train", "eval", "train", "eval", "eval", "train", "train"), timeout=20)
    assert [v["broadcasts"] for v in counted.values] == [[1, 1, 0, 1, 0, 0, 1]] * 2
    assert counted.values[0]["stats"] == 32


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


def test_detail_names_the_slow_rank_of_the_save():
    """No DDP here (the loop makes its own group), so DETAIL at creation is safe on 2.13: its
    monitored barrier makes rank 1 name rank 0."""
    result = replace(LESSON.scenario("slow_rank0_save").broken, env=l13.DETAIL).run()
    said = result.ranks[1].error.message
    assert "received errors while waiting for send/recv from rank 0" in said
    assert "Please check rank 0 logs for faulty rank" in said


def test_torchs_analyser_reads_the_dump_files_once_gloos_group_table_is_filled(tmp_path):
    """The files land at TORCH_FR_DUMP_TEMP_FILE + rank; fr_trace fails on gloo's raw record
    (its group table names no group on torch 2.13) and names the parting collective once the
    table is filled in copies."""
    stuck = replace(LESSON.scenario("uneven_steps").broken,
                    env={"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "trace_")}).run()
    assert stuck.status == "timeout"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_0", "trace_1"]
    raw = launch(l13.torch_analyser, str(tmp_path), world_size=1, init_process_group=False,
                 timeout=60)
    assert raw.ranks[0].error.type == "KeyError" and "in build_collectives" in raw.ranks[0].error.traceback
    filled = launch(l13.torch_analyser, str(tmp_path), world_size=1, init_process_group=False,
                    timeout=60, fill_group_table=True)
    said = filled.ranks[0].stderr
    assert "Collective sequence number: 7 has errors" in said
    assert "Expected collective type: 'barrier' does not match found collective type: 'all_reduce'" in said
    assert divergence.find(stuck.ranks).seq == 7


def test_figure_marks_where_the_ranks_part(runs):
    results = {s.name: {w: runs(s.name, w) for w in ("broken", "fixed")} for s in LESSON.scenarios}
    fig = LESSON.figures(results)["collective_timelines"]
    axes = fig.axes
    assert len(axes) == 8
    dashed = [any(line.get_linestyle() == "--" for line in ax.lines) for ax in axes]
    assert dashed == [True, False, False, False, True, False, True, False]
    assert all(ax.get_xlabel() for ax in axes)
