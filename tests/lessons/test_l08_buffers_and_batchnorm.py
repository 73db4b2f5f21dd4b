"""Lesson 08 beyond the registry's declarations: the modules' maths in one process, the
measured consequences of DDP's buffer sync, the flag's name on this torch, SyncBatchNorm's
refusals on the CPU, the checker and the pictures.

The generic test (tests/course/test_registry.py) runs every scenario broken and fixed against its
declaration; distributed tests here pair a public test with a per-rank function."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddp_lab
from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l08_buffers_and_batchnorm as l08
from ddp_lab.course.registry import get_lesson
from conftest import scenario_run  # one run a session, a notebook's where it made it


LESSON = get_lesson("08")


# --- one process: the modules' maths ----------------------------------------------------

def test_synced_norm_is_batchnorm_in_one_process():
    torch.manual_seed(0)
    x = torch.randn(8, 5) * 3 + 1
    ours, theirs = l08.SyncedNorm1d(5), nn.BatchNorm1d(5)
    with torch.no_grad():
        ours.weight.uniform_()
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.running_mean, theirs.running_mean)
    torch.testing.assert_close(ours.running_var, theirs.running_var)
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)


def test_running_center_moves_towards_the_batch_mean():
    center = l08.RunningCenter(3, momentum=0.5)
    x = torch.full((4, 3), 2.0)
    center(x)
    assert center.running_mean.tolist() == [1.0, 1.0, 1.0] and int(center.batches_seen) == 1
    center.eval()
    center(x)
    assert int(center.batches_seen) == 1  # eval does not update


def test_reference_running_mean_is_the_mean_over_every_shard():
    ref = l08.reference_running_mean(world_size=2, steps=1, momentum=1.0)
    x0, _ = l08.shard_batch(0, 0)
    x1, _ = l08.shard_batch(1, 0)
    torch.testing.assert_close(torch.tensor(ref[0]), torch.cat([x0, x1]).mean(0))


def test_this_torch_names_the_flag_forward_sync_buffers():
    params = inspect.signature(DDP.__init__).parameters
    assert "forward_sync_buffers" in params and "broadcast_buffers" in params
    assert params["broadcast_buffers"].default is None  # None: "not given", so no warning
    assert l08.buffer_sync_kwargs(False) == {"forward_sync_buffers": False}


# --- on real ranks ------------------------------------------------------------------------

def test_ddp_sync_keeps_rank0_statistic_and_hides_the_drift():
    local = scenario_run(LESSON.scenario("local_buffer"), "broken")
    synced = scenario_run(LESSON.scenario("rank0_buffer"), "broken")
    for run in (local, synced):
        assert run.values[0]["drifts"]["linear.weight"] == 0.0  # parameters: in sync
    # rank 0 never receives anything: its buffer is the same with and without DDP's sync
    assert synced.values[0]["history"] == local.values[0]["history"]
    # the sync makes rank 1 start each step from rank 0's value: after the step they differ
    # by one local update (momentum 0.1 of the gap), far less than without the sync
    assert 0.01 < synced.values[0]["drift"] < 0.5 * local.values[0]["drift"]
    # and the statistic stays about half the shards' offset (1.0) away from the truth
    assert synced.values[0]["bias"] > 0.3


def test_the_fixed_buffer_is_the_all_data_running_mean_on_every_rank():
    result = scenario_run(LESSON.scenario("local_buffer"), "fixed")
    for value in result.values:
        torch.testing.assert_close(torch.tensor(value["history"]), torch.tensor(value["reference"]),
                                   atol=1e-6, rtol=0)


def test_old_flag_warns_and_skips_the_init_sync():
    old = scenario_run(LESSON.scenario("deprecated_flag"), "broken")
    new = scenario_run(LESSON.scenario("deprecated_flag"), "fixed")
    for value in old.values:
        assert len(value["warnings"]) == 1 and "forward_sync_buffers=False` still syncs" in value["warnings"][0]
    assert old.values[0]["init_drift"] == 1.0 and new.values[0]["init_drift"] == 0.0
    assert new.values[1]["warnings"] == []


def test_batchnorm_gap_is_in_every_trained_layer():
    gaps = scenario_run(LESSON.scenario("batchnorm_small_batches"), "broken").values[0]["gaps"]
    for name in ("inp.weight", "norm.weight", "norm.bias", "out.weight", "norm.running_mean",
                 "norm.running_var"):
        assert gaps[name] > 1e-2, (name, gaps)
    assert gaps["inp.bias"] < 1e-5  # a bias before BatchNorm gets no gradient: the mean removes it


def _syncbn_forward_on_cpu() -> dict:
    layer = nn.SyncBatchNorm(4)
    layer(torch.randn(4, 4))
    return {}


def test_syncbatchnorm_refuses_cpu_input_even_without_ddp():
    result = ddp_lab.launch(_syncbn_forward_on_cpu, backend="gloo")
    assert result.status == "error"
    err = result.ranks[0].error
    assert err.type == "ValueError" and "SyncBatchNorm expected input tensor to be on GPU" in err.message


def _gradient_through_all_reduce_sum() -> dict:
    rank = dist.get_rank()
    x = torch.tensor([float(rank + 1)], requires_grad=True)
    total = l08.AllReduceSum.apply(x)  # 1 + 2 = 3 on both ranks
    (total * (rank + 1)).sum().backward()  # rank r's loss weighs the total by r + 1
    return {"total": total.item(), "grad": x.grad.item()}


def test_all_reduce_sum_sends_the_gradient_back_to_every_rank():
    result = ddp_lab.launch(_gradient_through_all_reduce_sum, backend="gloo").raise_for_status()
    # d(sum of both ranks' losses)/dx_r = 1 + 2 = 3, on each rank
    assert [v["total"] for v in result.values] == [3.0, 3.0]
    assert [v["grad"] for v in result.values] == [3.0, 3.0]


def test_checker_rejects_the_local_buffer_and_accepts_the_synced_one():
    scenario = LESSON.scenario("local_buffer")
    assert try_fix(scenario, center_cls=l08.SyncedRunningCenter).passed
    verdict = try_fix(scenario, center_cls=l08.RunningCenter)
    assert not verdict.passed and "drift" in verdict.problems[0]
    norm = LESSON.scenario("batchnorm_small_batches")
    assert not try_fix(norm, norm_cls=nn.BatchNorm1d).passed


@pytest.mark.slow
def test_the_pictures_have_labelled_axes():
    runs = {name: {which: scenario_run(LESSON.scenario(name), which) for which in ("broken", "fixed")}
            for name in ("local_buffer", "rank0_buffer", "batchnorm_small_batches")}
    figures = LESSON.figures(runs)
    assert set(figures) == {"buffers_per_rank", "batchnorm_running_mean"}
    for fig in figures.values():
        for ax in fig.axes:
            assert ax.get_xlabel() == "training step" and ax.get_ylabel() and ax.get_title()
            assert len(ax.get_lines()) == 3  # rank 0, rank 1, the one-process reference
