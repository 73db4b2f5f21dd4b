"""Lesson 12 beyond the registry's declarations: which rank saw what, the shard arithmetic
behind the silent errors, the registered tie's refusal, the memory against the formula, the
figure. Runs are shared through conftest's `runs` fixture."""
from __future__ import annotations

import math
import re

import pytest

from ddp_lab.lessons import l12_sharded_modules as l12

LESSON = l12.LESSON


@pytest.fixture(autouse=True, scope="module")
def deepspeed_ready():
    """DeepSpeed's C++ op built (a no-op when it is: `ddp-lab build-ops` ran in .ci/run) and
    DeepSpeed imported once in the fork server, so each ZeRO-3 rank starts in about a second."""
    LESSON.prepare()


def test_tie_across_units_fails_on_every_rank_in_the_tied_projection(runs):
    broken = runs("tied_across_units", "broken")
    for r in broken.ranks:
        assert r.error.message.startswith("aten.mm.default got mixed torch.Tensor and DTensor")
        assert "F.linear(h, self.emb.weight)" in r.error.traceback
    losses = runs("tied_across_units", "fixed").values[0]["losses"]
    assert losses[1] < losses[0]


def test_registered_tie_is_refused_at_the_roots_first_forward_not_by_fully_shard():
    """Every fully_shard call succeeds; FSDP2's lazy init in the root's first forward raises
    (torch 2.13 fsdp/_fully_shard/_fsdp_state.py:210 _lazy_init -> :223)."""
    result = LESSON.scenario("tied_across_units").broken.with_kwargs(
        model_cls=l12.RegisteredTie).run()
    err = result.root_cause.error
    assert err.type == "ValueError"
    assert "use fully_shard([module_a, module_b])" in err.message
    frames = re.findall(r"line \d+, in (\w+)\n +(.*)", err.traceback)
    assert frames[0] == ("train_tied", "model(tokens(rank)).flatten(0, 1), tokens(rank + 10).flatten())")
    assert [f for f, _ in frames[-3:]] == ["_root_pre_forward", "_lazy_init",
                                          "_validate_no_duplicate_params"]
    assert not any(f in ("shard", "fully_shard") for f, _ in frames)


def test_both_norm_fixes_are_exact_and_the_cheap_one_reduces_one_number(runs):
    """norm().full_tensor() all-reduces a scalar; full_tensor().norm() all-gathers the weight
    (read from each run's flight record: the read is the run's last collective)."""
    cheap = runs("read_outside_forward", "fixed")
    whole = LESSON.scenario("read_outside_forward").fixed.with_kwargs(read=l12.norm_of_full).run()
    assert max(v["norm_error"] for v in cheap.values + whole.values) < 1e-6
    assert str(cheap.ranks[0].collectives[-1]) == "all_reduce [] float32"
    assert str(whole.ranks[0].collectives[-1]) == "all_gather [2, 64] float32"


def test_the_logged_norm_is_each_ranks_shard(runs):
    """Silent: each rank logs its own shard's norm, and the two compose to the truth."""
    values = runs("read_outside_forward", "broken").values
    assert values[0]["logged"] != values[1]["logged"]
    for step, truth in enumerate(values[0]["truth"]):
        composed = math.hypot(values[0]["logged"][step], values[1]["logged"][step])
        assert composed == pytest.approx(truth, rel=1e-4)
    assert values[0]["what_was_read"] == "DTensor of shape (4, 64), local shard (2, 64)"


def test_full_state_dict_reaches_rank0_only(runs):
    broken = runs("sharded_state_dict", "broken")
    assert broken.root_cause.error.first_line == "Error(s) in loading state_dict for Sequential:"
    fixed = runs("sharded_state_dict", "fixed").values
    assert [v["keys"] for v in fixed] == [6, 0]
    assert fixed[0]["value_types"] == ["Tensor"]


def test_zero3_parameters_are_empty_outside_forward(runs):
    broken = runs("zero3_penalty", "broken").values
    fixed = runs("zero3_penalty", "fixed").values
    for v in broken:
        assert v["penalty"] == [0.0, 0.0, 0.0] and v["shapes_seen"] == [[0]]
        assert min(v["truth"]) > 1
    assert fixed[0]["penalty"] == fixed[0]["truth"]


def test_memory_per_rank_against_the_formula(runs):
    values = runs("memory_per_rank", "fixed").values
    psi = values[0]["psi"]
    for v in values:  # + one step counter per tensor; DDP's buckets: one more gradient copy
        assert v["bytes"]["ddp"] == {"params": 4 * psi, "grads": 4 * psi,
                                     "optim": 8 * psi + 6 * 4, "buckets": 4 * psi}
        assert v["bytes"]["zero1"]["buckets"] == 4 * psi and "buckets" not in v["bytes"]["fsdp2"]
        for part, want in l12.formula_bytes(3, psi, 2).items():
            assert v["bytes"]["fsdp2"][part] == pytest.approx(want, abs=64)
    for v in values:  # DeepSpeed stage 3: the formula, plus a float32 master partition
        want = l12.formula_bytes(3, psi, 2)
        assert v["bytes"]["ds3"]["params"] == pytest.approx(want["params"], abs=64)
        assert v["bytes"]["ds3"]["grads"] == pytest.approx(want["grads"], abs=64)
        assert v["bytes"]["ds3"]["optim"] == pytest.approx(want["optim"] + 4 * psi / 2, abs=64)
        assert v["bytes"]["ds1"]["optim"] == pytest.approx(8 * psi / 2 + 4 * psi / 2, abs=64)
    zero1 = [v["bytes"]["zero1"]["optim"] for v in values]
    assert sum(zero1) == pytest.approx(8 * psi, abs=64)  # split, but by whole parameters:
    assert max(zero1) > 1.5 * l12.formula_bytes(1, psi, 2)["optim"]  # not evenly


def test_memory_figure_has_labelled_axes(runs):
    fig = l12.figures({"memory_per_rank": {"fixed": runs("memory_per_rank", "fixed")}})[
        "memory_per_rank"]
    ax = fig.axes[0]
    assert "KiB" in ax.get_ylabel() and ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["rank 0", "rank 1", "formula"]


def test_a_frozen_part_left_to_the_optimizer_is_still_reduced(runs):
    """Measured, not assumed: FSDP2 accepts frozen and trainable parameters in one unit,
    gathers the frozen weight (forward and backward) and never reduce-scatters it."""
    broken = runs("frozen_part_in_unit", "broken").values
    fixed = runs("frozen_part_in_unit", "fixed").values
    for b, f in zip(broken, fixed):
        assert b["base_moved"] == f["base_moved"] == 0.0  # frozen either way
        assert b["gathered_per_step"] == f["gathered_per_step"]  # same all-gathers
        assert f["reduced_per_step"] == f["adapter_shard_bytes"]  # only the adapter reduced
        assert b["frozen_grad_held"] > 0 and f["frozen_grad_held"] is None


def test_bfloat16_policy_leaves_the_blocks_constants_in_float32(runs):
    broken = runs("mixed_precision_constants", "broken")
    for r in broken.ranks:
        assert "h * self.scale + self.shift" in r.error.traceback
    dtypes = runs("mixed_precision_constants", "fixed").values[0]["dtypes"]
    assert dtypes == {"lin output": "bfloat16", "out input": "bfloat16",
                      "scale (buffer)": "float32", "shift (plain tensor)": "float32",
                      "output": "bfloat16"}


def test_uneven_forwards_hang_in_deepspeeds_fetch_and_agreeing_fixes_it(runs):
    broken = runs("zero3_uneven_forwards", "broken")
    assert [r.status for r in broken.ranks] == ["timeout", "timeout"]
    assert broken.ranks[1].stuck_in() == "all_reduce()"  # rank 1 is done and waits for a metric
    # rank 0 is in DeepSpeed's parameter fetch, named past its decorators and its wait
    assert broken.ranks[0].stuck_in() == "fetch_sub_module()"
    assert "site-packages" not in broken.ranks[0].stack_text(12)  # no machine path shown
    fixed = runs("zero3_uneven_forwards", "fixed").values
    assert [(v["wanted"], v["forwards"]) for v in fixed] == [(3, 3), (2, 3)]


def test_a_gathered_edit_after_initialize_is_undone_by_the_step_and_the_master_edit_is_not(runs):
    """ZeRO-3 keeps a float32 master partition apart from the weights forward uses (float32
    training, DeepSpeed 0.19.8): a GatheredParameters(modifier_rank=0) write after initialize is
    seen, then the step copies the master back; safe_set_full_fp32_param sets the master, seen
    after the step; under zero.Init, before initialize, modifier_rank sticks."""
    lost, kept = (runs("zero3_edit_after_initialize", w).values for w in ("broken", "fixed"))
    for v in lost:
        assert v["off_before_step"] < 1e-6 and v["off_after_step"] > 0.5
    for v in kept:
        assert v["off_before_step"] > 0.5 and v["off_after_step"] < 0.01
    before = LESSON.scenario("zero3_edit_after_initialize").broken.with_kwargs(
        before_initialize=True).run()
    assert before.ok and all(v["off_after_step"] < 0.01 for v in before.values)
