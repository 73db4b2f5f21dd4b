"""Lesson 07: data across ranks -- DistributedSampler, set_epoch, uneven inputs and Join.

One training loop (`runs.train`) runs every scenario; what changes is the data pipeline it is
given. The picture is in `figures.py`.
"""
from __future__ import annotations

from functools import partial

from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import draw_seen, figures, seen_matrix
from .runs import (IndexedDataset, data_metrics, distributed_batches, even_filtered_batches,
                   filtered_shard_batches, sampler_batches_no_set_epoch, shuffled_batches, train)

__all__ = ["LESSON", "IndexedDataset", "data_metrics", "distributed_batches", "draw_seen",
           "even_filtered_batches", "figures", "filtered_shard_batches", "sampler_batches_no_set_epoch",
           "seen_matrix", "shuffled_batches", "train"]


def _stuck_in_backward(result) -> list[str]:
    """Rank 0 (more batches) must be the one left in DDP's gradient all-reduce, in backward."""
    r0 = result.ranks[0]
    if r0.status != "timeout" or "in backward" not in r0.stack_summary():
        return [f"rank 0 is {r0.status!r}, expected a timeout inside backward()"]
    return []


def _also_zero(name: str, result) -> list[str]:
    """A fixed pipeline must do both: disjoint shares (overlap 0) and a new order every epoch
    (repeated 0); each scenario declares one as its metric and checks the other here."""
    value = result.values[0][name]
    return [f"{name} = {value:.3g}, expected < 1e-06 as well"] if value > 1e-6 else []


LESSON = Lesson(
    id="07",
    error_class="data across ranks",
    title="Data across ranks: DistributedSampler, set_epoch, uneven inputs and Join",
    notebook="07_data_across_ranks",
    figures=figures,
    scenarios=[
        Scenario("no_sampler", "No DistributedSampler: every rank trains on the same samples",
                 broken=Variant(train, Expect("ok", metric="overlap", above=0.99),
                                kwargs={"batches": shuffled_batches}),
                 fixed=Variant(train, Expect("ok", metric="overlap", below=1e-6,
                                             extra=partial(_also_zero, "repeated")),
                               kwargs={"batches": distributed_batches}),
                 summary="shuffle=True on identically seeded ranks gives each the same batches; "
                         "DistributedSampler gives each rank its own share"),
        Scenario("no_set_epoch", "DistributedSampler without set_epoch: the same order every epoch",
                 broken=Variant(train, Expect("ok", metric="repeated", above=0.99),
                                kwargs={"batches": sampler_batches_no_set_epoch}),
                 fixed=Variant(train, Expect("ok", metric="repeated", below=1e-6,
                                             extra=partial(_also_zero, "overlap")),
                               kwargs={"batches": distributed_batches}),
                 summary="the sampler shuffles with seed + epoch; without set_epoch every epoch "
                         "repeats the first one's order"),
        # gloo: a collective blocks until every rank calls it, so the timeout finds rank 1 in
        # all_gather and rank 0 in backward. NCCL returns once queued: the hang shows at a sync.
        Scenario("uneven_inputs", "Uneven inputs: the rank with more batches waits forever",
                 broken=Variant(train, Expect("timeout", match="all_gather", ranks=(1,),
                                              extra=_stuck_in_backward),
                                kwargs={"batches": filtered_shard_batches}, timeout=3, grace=2),
                 fixed=Variant(train, Expect("ok", metric="drift", below=1e-6),
                               kwargs={"batches": filtered_shard_batches, "join": True}),
                 summary="rank 0 has 12 batches, rank 1 has 9: rank 0 waits in its 10th gradient "
                         "all-reduce; `with model.join():` shadows it (or even the batches)"),
    ],
)
