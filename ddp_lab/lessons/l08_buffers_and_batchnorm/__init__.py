"""Lesson 08: buffers and BatchNorm -- buffers updated from local data, what DDP's buffer sync
does (and the name it has in torch 2.13), BatchNorm on small per-rank batches, SyncBatchNorm
on CPU and a synchronised norm written with all-reduces.

`modules` holds the modules, `runs` what each rank runs, `figures` the pictures.
"""
from __future__ import annotations

from functools import partial

from torch import nn

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from .figures import figures
from .modules import (AllReduceSum, CenteredRegressor, NormNet, RunningCenter, SyncedNorm1d,
                      SyncedRunningCenter, distributed)
from .runs import (buffer_sync_kwargs, example_input, global_batch, reference_running_mean,
                   shard_batch, train_norm, train_norm_on_cpu, train_stats, wrap_with)

DEPRECATION = "`broadcast_buffers` is deprecated"


def _warned(result) -> list[str]:
    """The deprecated flag must give PyTorch's FutureWarning on every rank."""
    return [f"rank {r.rank}: no FutureWarning {DEPRECATION!r}" for r in result.ranks
            if not any(w.startswith("FutureWarning") and DEPRECATION in w for w in r.value["warnings"])]


def _not_warned(result) -> list[str]:
    return [f"rank {r.rank} warned: {r.value['warnings']}" for r in result.ranks if r.value["warnings"]]


def _unbiased(result) -> list[str]:
    """Agreeing is not enough: the buffer must be the running mean of every rank's data."""
    bias = result.values[0]["bias"]
    return [f"bias = {bias:.4g}, expected < 1e-05: rank 0's running mean is not the running "
            "mean of all ranks' data"] if bias >= 1e-5 else []


CENTER_CASE = ModuleCase(broken=partial(CenteredRegressor, RunningCenter),
                         fixed=partial(CenteredRegressor, SyncedRunningCenter), input=example_input)
NORM_CASE = ModuleCase(broken=partial(NormNet, nn.BatchNorm1d), fixed=partial(NormNet, SyncedNorm1d),
                       input=example_input)

LESSON = Lesson(
    id="08",
    error_class="buffers and BatchNorm",
    title="Buffers and BatchNorm",
    notebook="08_buffers_and_batchnorm",
    figures=figures,
    scenarios=[
        Scenario("local_buffer", "A buffer updated from local data: ranks drift apart",
                 broken=Variant(train_stats, Expect("ok", metric="drift", above=1e-3),
                                kwargs={"center_cls": RunningCenter, "sync_buffers": False}),
                 fixed=Variant(train_stats, Expect("ok", metric="drift", below=1e-6, extra=_unbiased),
                               kwargs={"center_cls": SyncedRunningCenter, "sync_buffers": False}),
                 summary="each rank updates its running mean from its own batch; all-reduce the "
                         "batch statistics before the update",
                 module=CENTER_CASE),
        Scenario("rank0_buffer", "DDP's buffer sync: the ranks agree, on rank 0's data alone",
                 broken=Variant(train_stats, Expect("ok", metric="bias", above=0.1),
                                kwargs={"center_cls": RunningCenter, "sync_buffers": True}),
                 fixed=Variant(train_stats, Expect("ok", metric="bias", below=1e-5),
                               kwargs={"center_cls": SyncedRunningCenter, "sync_buffers": True}),
                 summary="forward_sync_buffers copies rank 0's buffers over the others at each "
                         "forward: rank 1's data never reaches the statistic",
                 module=CENTER_CASE),
        Scenario("deprecated_flag", "broadcast_buffers is deprecated: forward_sync_buffers",
                 broken=Variant(wrap_with, Expect("ok", metric="init_drift", above=0.5, extra=_warned),
                                kwargs={"flag": "broadcast_buffers"}),
                 fixed=Variant(wrap_with, Expect("ok", metric="init_drift", below=1e-6,
                                                 extra=_not_warned),
                               kwargs={"flag": "forward_sync_buffers"}),
                 summary="the old flag warns (FutureWarning) and skips the buffer sync at init; "
                         "forward_sync_buffers=False still syncs buffers when DDP wraps the module"),
        Scenario("batchnorm_small_batches", "BatchNorm on 4 samples per rank: per-rank statistics",
                 broken=Variant(train_norm, Expect("ok", metric="gap", above=1e-3),
                                kwargs={"norm_cls": nn.BatchNorm1d}),
                 fixed=Variant(train_norm, Expect("ok", metric="gap", below=1e-4),
                               kwargs={"norm_cls": SyncedNorm1d}),
                 summary="each rank normalises with its own 4-sample statistics, so 2 ranks do not "
                         "train the model one process would; all-reduce the statistics",
                 module=NORM_CASE),
        Scenario("syncbn_on_cpu", "SyncBatchNorm refuses CPU modules",
                 broken=Variant(train_norm_on_cpu, Expect("error", "ValueError",
                                "SyncBatchNorm layers only work with GPU modules", ranks=(0, 1)),
                                kwargs={"convert_sync_bn": True}, init_process_group=False),
                 fixed=Variant(train_norm_on_cpu, Expect("ok", metric="gap", below=1e-4),
                               kwargs={"norm_cls": SyncedNorm1d}, init_process_group=False),
                 summary="DDP rejects SyncBatchNorm on a CPU module; on CPU, synchronise the "
                         "statistics with all-reduces (SyncedNorm1d)"),
    ],
)

__all__ = ["LESSON", "AllReduceSum", "CenteredRegressor", "NormNet", "RunningCenter",
           "SyncedNorm1d", "SyncedRunningCenter", "distributed", "buffer_sync_kwargs",
           "example_input", "global_batch", "reference_running_mean", "shard_batch", "train_norm",
           "train_norm_on_cpu", "train_stats", "wrap_with", "figures"]
