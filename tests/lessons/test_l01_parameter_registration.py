"""Lesson 01 beyond the registry's declarations: the tensor walker, what the broken runs measure
step by step, the debug-level variant, the other fixes, the cost of find_unused_parameters, the
DataParallel process count, the figure and the exercise checker.

Every run here is real: ranks are separate processes with a gloo process group."""
from __future__ import annotations

import pytest

import torch
from torch import nn

import ddp_lab
from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l01_parameter_registration as l01
from ddp_lab.lessons.l01_parameter_registration import inventory, modules as m
from ddp_lab.course.registry import get_lesson

LESSON = get_lesson("01")
CPU_ONLY = pytest.mark.skipif(l01.ON_GPUS, reason="on 2 GPUs the unregistered tensors fail as "
                              "a device mismatch instead (declared in the registry)")


# The walker -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, missing", [
    (m.GainNet, ["gain"]),
    (m.StackNet, ["blocks[0].weight", "blocks[0].bias", "blocks[1].weight", "blocks[1].bias",
                  "scales[0]", "scales[1]"]),
    (m.BareLinear, ["weight", "bias"]),
])
def test_inventory_finds_what_parameters_misses(cls, missing):
    module = cls()
    assert inventory.unregistered(module) == missing
    registered = {n for n, _ in module.named_parameters()}
    assert not registered & set(missing)
    assert set(inventory.trainable(module)) == registered | set(missing)


@pytest.mark.parametrize("cls", [m.GainNetFixed, m.StackNetFixed, m.BareLinearFixed,
                                 m.AuxHeadNetFixed, m.SmallNet])
def test_fixed_modules_hold_nothing_unregistered(cls):
    module = cls()
    assert inventory.unregistered(module) == []
    assert set(inventory.trainable(module)) == {n for n, _ in module.named_parameters()}


def test_inventory_tells_buffers_and_dicts_apart():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("saved", torch.zeros(2))
            self.register_buffer("derived", torch.zeros(2), persistent=False)
            self.heads = {"a": nn.Linear(2, 2)}
            self.plain = torch.ones(2)

    how = {r["name"]: r["how"] for r in inventory.table(Mixed())}
    assert how == {"saved": inventory.BUFFER, "derived": inventory.BUFFER_NOT_SAVED,
                   "heads['a'].weight": inventory.PLAIN_CONTAINER,
                   "heads['a'].bias": inventory.PLAIN_CONTAINER,
                   "plain": inventory.PLAIN_ATTRIBUTE}
    assert "plain tensor attribute" in inventory.format_table(inventory.table(Mixed()))


# What the broken runs measure, step by step -----------------------------------------------------
@CPU_ONLY
@pytest.mark.parametrize("name, plain, synced", [
    ("plain_tensor", "gain", "linear.weight"),
    ("plain_list", "blocks[0].weight", "head.weight"),
])
def test_unregistered_tensors_never_sync_and_never_train(runs, name, plain, synced):
    result = runs(name, "broken")
    for rank in result.ranks:
        value = rank.value
        assert min(value["tensor_drift_per_step"][plain]) > 1e-3  # apart at every step
        assert max(value["tensor_drift_per_step"][synced]) == 0.0  # DDP syncs what it knows
        assert value["moved"][plain] == 0.0  # SGD never stepped it
        assert value["moved"][synced] > 1e-4  # while the registered ones train
        assert plain in value["unregistered"] and plain not in value["registered"]


@CPU_ONLY
def test_data_parallel_in_each_rank_keeps_drifting_as_it_trains(runs):
    drift = runs("data_parallel", "broken").ranks[0].value["drift_per_step"]
    assert drift[0] > 1e-3  # no broadcast at construction
    assert drift[-1] != drift[0]  # and each rank's own steps move the copies differently
    assert max(runs("data_parallel", "fixed").ranks[0].value["drift_per_step"]) == 0.0


def test_unused_parameter_fails_at_the_second_step_and_names_indices(runs):
    result = runs("unused_parameter", "broken")
    names = [n for n, _ in m.AuxHeadNet().named_parameters()]
    indices = " ".join(str(names.index(n)) for n in ("aux_head.weight", "aux_head.bias"))
    for rank in result.ranks:
        assert f"Parameter indices which did not receive grad for rank {rank.rank}: {indices}" \
            in rank.error.message
        assert "Parameters which did not receive grad" not in rank.error.message
        assert rank.stdout.splitlines() == ["step 0 done"]


def test_debug_info_names_the_unused_parameters():
    result = l01.WITH_DEBUG_INFO.run()
    l01.WITH_DEBUG_INFO.expect.assert_met(result)
    assert result.ranks[1].error.message.count("aux_head.weight") == 1


@pytest.mark.skipif(torch.__version__ != "2.13.0+cpu", reason="a crash of this torch build")
def test_debug_detail_crashes_the_rank_on_this_build():
    result = l01.WITH_DEBUG_DETAIL.run()
    l01.WITH_DEBUG_DETAIL.expect.assert_met(result)
    assert "_ddp_init_helper" in result.ranks[0].stderr  # inside the DDP constructor


@pytest.mark.parametrize("variant", ["FIND_UNUSED", "STATIC_GRAPH"])
def test_other_fixes_keep_the_ranks_in_sync(variant):
    v = getattr(l01, variant)
    result = v.run()
    v.expect.assert_met(result)
    # the auxiliary head is registered: broadcast at construction, never given a gradient
    assert result.ranks[0].value["moved"]["aux_head.weight"] == 0.0
    assert result.ranks[0].value["moved"]["body.weight"] > 1e-4


def test_find_unused_cost_times_every_model_against_the_fixed_one():
    # The ratios themselves are not asserted: on this tiny model they ranged from 0.89x to 1.65x
    # over 6 runs on a shared 2-core machine (the notebook states that range).
    value = ddp_lab.launch(l01.find_unused_cost).raise_for_status().ranks[0].value
    assert set(value["ms"]) == set(value["ratio"]) and len(value["ms"]) == 4
    assert all(0 < ms < 1000 for ms in value["ms"].values())
    assert value["ratio"]["fixed module"] == 1.0
    assert value["find_unused_ratio"] == value["ratio"]["find_unused_parameters=True"] > 0


def test_data_parallel_is_one_process_ddp_is_one_per_rank():
    dp = ddp_lab.launch(l01.who_runs_forward, wrapper="dp", world_size=1,
                        init_process_group=False).raise_for_status()
    ddp = ddp_lab.launch(l01.who_runs_forward, wrapper="ddp").raise_for_status()
    assert [v["wrapper"] for v in dp.values] == ["DataParallel"]
    assert len({v["pid"] for v in ddp.values}) == 2
    if not torch.cuda.is_available():
        assert dp.values[0]["device_ids"] == []  # no GPU: DataParallel just calls the module
        assert dp.values[0]["calls"] == [{"thread": "MainThread", "device": "cpu"}]


# The figure and the exercise checker ------------------------------------------------------------
@CPU_ONLY
def test_figure_has_labelled_axes_and_the_drift_lines(runs):
    results = {n: {w: runs(n, w) for w in ("broken", "fixed")}
               for n in ("plain_tensor", "data_parallel")}
    figs = LESSON.figures(results)
    assert list(figs) == ["parameter_drift"]
    axes = figs["parameter_drift"].axes
    assert len(axes) == 4
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        assert ax.get_lines()
    labels = [line.get_label() for line in axes[0].get_lines()]
    assert "gain (unregistered)" in labels


class HeadsInADict(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.heads = {"a": nn.Linear(8, 1), "b": nn.Linear(8, 1)}

    def forward(self, x):
        h = torch.relu(self.body(x))
        return self.heads["a"](h) + self.heads["b"](h)


class HeadsInAModuleDict(HeadsInADict):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict(self.heads)


@CPU_ONLY
def test_exercise_checker_tells_a_fix_from_the_bug():
    scenario = LESSON.scenario("plain_list")
    wrong = try_fix(scenario, model_cls=HeadsInADict)
    assert not wrong.passed and "drift" in wrong.problems[0]
    right = try_fix(scenario, model_cls=HeadsInAModuleDict)
    assert right.passed, right.problems
