"""Lesson 15 beyond the registry's declarations: what torch 2.13 reports for each scenario (the
guard that fails, the graph break's reason and line, DDPOptimizer's split, the trace-time DTensor
error), the modules' arithmetic in one process, the second fix for ragged ranks and the figure (the
checker is the notebook's exercise, run there). The scenario runs
are shared with test_registry through the `runs` fixture."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

from ddp_lab import launch
from ddp_lab.launching import divergence
from ddp_lab.lessons import l15_compile as l15
from ddp_lab.lessons.l15_compile.figures import PANELS
from ddp_lab.lessons.l15_compile import modules as _modules
from ddp_lab.course.registry import get_lesson

# "l15_compile/modules.py", as the ranks name it (derived: a path written out breaks on a move)
MODULES = l15.__name__.rpartition(".")[2] + "/" + os.path.basename(_modules.__file__)
LESSON = get_lesson("15")
pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture(scope="module", autouse=True)
def warm_compiler():
    l15.prepare()  # the fork server imports the compiler once, as the tour and notebook do


def line_of(fn, text: str) -> int:
    """The line number of `text` in `fn`'s source."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, ln in enumerate(lines) if text in ln)


# --- one process: the fixes compute what the broken modules compute ---------------------------

def test_the_tensor_counter_ramps_as_the_int_counter_does():
    torch.manual_seed(0)
    broken, fixed = l15.WarmupGate(warmup=4), l15.WarmupGateFixed(warmup=4)
    fixed.lin.load_state_dict(broken.lin.state_dict())
    x = torch.randn(2, l15.modules.WIDTH)
    for _ in range(6):  # past the warm-up: both stop at 1.0
        torch.testing.assert_close(broken(x), fixed(x))
    assert broken.calls == int(fixed.calls) == 6


def test_padding_with_the_mask_leaves_the_output_unchanged():
    torch.manual_seed(0)
    net = l15.TokenNet()
    ids, mask = l15.token_batches(1, 2, pad=False)[1]
    padded_ids, padded_mask = l15.token_batches(1, 2, pad=True)[1]
    assert ids.shape[1] == 8 and padded_ids.shape[1] == l15.MAX_LEN
    torch.testing.assert_close(net(ids, mask), net(padded_ids, padded_mask))


def test_the_pure_checkpointed_block_computes_the_same():
    torch.manual_seed(0)
    broken = l15.checkpointed_net()
    fixed = l15.checkpointed_net_fixed()
    fixed.load_state_dict(broken.state_dict())
    x = l15.features(0)
    torch.testing.assert_close(broken(x), fixed(x))


# --- on real ranks -----------------------------------------------------------------------------

def test_ddp_optimizer_compiles_one_graph_per_bucket(runs):
    one, split = runs("one_graph_no_overlap", "broken"), runs("one_graph_no_overlap", "fixed")
    for a, b in zip(one.values, split.values):
        assert a["buckets"] == b["buckets"] >= 2  # DDP's buckets do not change
        assert a["graphs"] == a["backward_graphs_per_step"] == 1 and a["split_reasons"] == []
        assert b["graphs"] == b["backward_graphs_per_step"] >= 2
        assert b["backward_before_first_bucket"] == 1 / b["graphs"]
        assert all(r.startswith(l15.DDP_SPLIT) for r in b["split_reasons"])


def test_the_counter_fails_its_guard_on_every_step(runs):
    broken = runs("recompile_every_step", "broken")
    line = line_of(l15.WarmupGate.forward, "self.calls += 1")
    for v in broken.values:
        assert v["recompiles_per_step"] == [0, 1, 1, 1] and v["graphs"] == 4
        guards = [r["guard"] for r in v["recompiles"]]
        assert guards == [f"self._modules['gate'].calls == {n}" for n in range(3)]
        assert v["recompiles"][0]["where"].endswith(f"{MODULES}:{line} in forward")
    fixed = runs("recompile_every_step", "fixed")
    assert [v["graphs"] for v in fixed.values] == [1, 1]


def test_only_the_rank_with_other_lengths_recompiles_and_the_other_waits(runs):
    broken = runs("ranks_compile_different_graphs", "broken")
    r0, r1 = broken.values
    assert r0["recompiles_per_step"] == [0] * 4 and r0["graphs"] == 1
    assert sum(r1["recompiles_per_step"]) >= 1 and r1["recompiles_per_step"][0] == 0
    assert any("size mismatch at index 1. expected 6, actual 8" in r["guard"] for r in r1["recompiles"])
    # the ranks still make the same collectives (DDP's, outside the graphs): nothing to part at
    assert divergence.find(broken.ranks) is None
    # at the step where rank 1 recompiles, rank 0 compiles nothing yet takes as long: it waits
    step = r1["recompiles_per_step"].index(max(r1["recompiles_per_step"]))
    assert r0["compile_s"][step] == 0 and r0["step_s"][step] > 0.5 * r1["step_s"][step]
    fixed = runs("ranks_compile_different_graphs", "fixed")
    assert [v["graphs"] for v in fixed.values] == [1, 1]


def test_dynamic_shapes_on_every_rank_also_keep_the_ranks_from_recompiling():
    """The notebook's second fix: compiled with dynamic=True, every rank starts from a graph
    with a dynamic length, and nothing recompiles, padded or not."""
    result = launch(l15.train_ragged, timeout=l15.TIMEOUT, dynamic=True).raise_for_status()
    assert [sum(v["recompiles_per_step"]) for v in result.values] == [0, 0]


def test_a_side_effect_in_the_checkpoint_leaves_the_blocks_uncompiled(runs):
    broken, fixed = runs("checkpoint_side_effect", "broken"), runs("checkpoint_side_effect", "fixed")
    line = line_of(l15.LoggedBlock.mlp, "self.last = h.detach()")
    for b, f in zip(broken.values, fixed.values):
        [brk] = b["user_breaks"]
        assert brk["reason"] == "HOP: Unsafe side effect"
        assert brk["where"].endswith(f"{MODULES}:{line} in mlp") and "self.last" in brk["code"]
        assert b["ops"] < f["ops"] / 2  # the checkpointed blocks ran uncompiled
        assert f["graphs"] == 1 and f["user_breaks"] == []


def test_fsdp2_whole_compile_fails_while_tracing_and_per_block_fails_eagerly(runs):
    whole = runs("fsdp2_tie_compiled", "broken")
    message = whole.ranks[0].error.message
    assert "Dynamo failed to run FX node with fake tensors" in message
    assert "size=(16, 16)" in message and "Shard(dim=0)" in message  # the rank's shard
    per_block = launch(l15.train_sharded, timeout=l15.TIMEOUT, per_block=True)
    err = per_block.ranks[0].error
    assert err.type == "RuntimeError" and "got mixed torch.Tensor and DTensor" in err.message
    fixed = runs("fsdp2_tie_compiled", "fixed")
    for v in fixed.values:  # a graph per unit's compute, a break at each FSDP2 hook
        assert v["graph_ops"] == [["embedding"], ["tanh"], ["linear"]] and v["fsdp_breaks"] >= 2


def test_figure_shows_every_rank_per_panel(runs):
    results = {name: {w: runs(name, w) for w in ("broken", "fixed")}
               for name in ("recompile_every_step", "ranks_compile_different_graphs")}
    fig = LESSON.figures(results)["compile_and_step_time"]
    assert len(fig.axes) == 4
    panels = [results[name][which] for name, which, _ in PANELS]
    for ax, result in zip(fig.axes, panels):
        assert ax.get_xlabel() == "training step" and ax.get_ylabel() and ax.get_title()
        assert len(ax.get_lines()) == 6  # per rank: compiled step, compiling, eager
        # a cross means "compiled in this step" (issue 38, point 12): one per step that compiled,
        # at its compile seconds, none where the rank compiled nothing
        crosses = [line for line in ax.get_lines() if line.get_marker() == "x"]
        for line, r in zip(crosses, result.ranks):
            done = {step: s for step, s in enumerate(r.value["compile_s"]) if s > 0}
            assert dict(zip(line.get_xdata(), line.get_ydata())) == done
    ragged = results["ranks_compile_different_graphs"]["broken"]
    assert list(fig.axes[2].get_lines()[1].get_xdata()) == [0]  # rank 0 compiled once, at step 0
    assert ragged.values[1]["compile_s"][1] > 0  # when rank 1 compiled again


def test_compiler_collectives_fail_to_compile_on_a_gloo_group():
    """Going further's claim, torch 2.13: a "gloo" group serves CPU and CUDA, two device types,
    and dynamo's compiler collectives want one (torch/_dynamo/output_graph.py:2573-2583): the
    assertion's own message fails to format, on every rank. When this changes, so does the text."""
    from ddp_lab.lessons.l15_compile import runs_wrapper

    result = launch(runs_wrapper.compiler_collectives, timeout=l15.TIMEOUT)
    for r in result.ranks:
        assert r.error is not None and r.error.type == "InternalTorchDynamoError", r.error
        assert "TypeError: sequence item 0: expected str instance, torch.device found" in r.error.message
