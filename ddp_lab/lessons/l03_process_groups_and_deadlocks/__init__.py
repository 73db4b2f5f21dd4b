"""Lesson 03: process groups that never form, collectives that only some ranks call or that do
not match, and the tools that turn the resulting hangs into errors that name a rank.

The per-rank code (and the timeline that survives a hang) is in `runs.py`; its picture in
`figures.py`.
"""
from __future__ import annotations

from dataclasses import replace

from ...course.registry import Expect, Lesson, Scenario, Variant
from ...launching.results import frames_text
from .figures import figures, spans_from_run, timeline_figure
from .runs import (LoggedTimeline, TinyNet, evaluate, init_group, per_rank, report_on_every_rank,
                   report_on_rank0, shard_losses, train_and_report, uneven_epoch)

__all__ = ["LESSON", "INIT_SILENT", "INIT_DUPLICATE_RANK", "WITH_BARRIER", "MISMATCH_DETAIL",
           "PLAIN_BARRIER", "TinyNet", "evaluate", "init_group", "report_on_every_rank",
           "report_on_rank0", "shard_losses", "train_and_report", "uneven_epoch", "per_rank",
           "LoggedTimeline", "spans_from_run", "timeline_figure", "printed_on_rank0_only", "where"]

DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
# On NCCL a collective returns to Python once it is queued on the GPU, so a hung rank's stack
# shows whatever waits for the GPU next; blocking wait makes it wait in the collective, as gloo
# does. (gloo ignores the variable.)
BLOCKING = {"TORCH_NCCL_BLOCKING_WAIT": "1"}
STORE_TIMEOUT = r"wait timeout after 3000ms"


def where(stack: str, depth: int = 5) -> str:
    """The innermost `depth` frames of the main thread in a faulthandler dump (a stopped rank's
    `.stack`, or a crashed rank's stderr), one `function  (file)` a line."""
    return frames_text(stack, depth)


# -- extra checks (RunResult -> list of problems) ------------------------------------------------

def _key_waited_for(rank: int):
    """Every rank timed out waiting for the store key of rank `rank`."""
    def problems(result):
        return [f"rank {r.rank} waited for {r.error.message.split('keys: ')[-1]!r}, not rank {rank}'s"
                for r in result.ranks if r.error and not r.error.message.endswith(f"/{rank}")]
    return problems


def _stack_of(rank: int, fragment: str):
    def problems(result):
        if fragment not in result.ranks[rank].stack:
            return [f"rank {rank} was not stopped in {fragment}: {result.ranks[rank].stuck_in()}"]
        return []
    return problems


def printed_on_rank0_only(steps: int = 3):
    """Rank 0 printed one line per step; no other rank printed anything."""
    def problems(result):
        problems = []
        lines = [ln for ln in result.ranks[0].stdout.splitlines() if "loss" in ln]
        if len(lines) != steps:
            problems.append(f"rank 0 printed {len(lines)} loss lines, expected {steps}")
        problems += [f"rank {r.rank} printed {len(r.stdout.splitlines())} lines, expected none"
                     for r in result.ranks[1:] if r.stdout.strip()]
        return problems
    return problems


def _rank1_silently_wrong(result):
    r1 = result.ranks[1] if result.world_size > 1 else None
    if r1 is None or not r1.ok:
        return [f"rank 1 is {r1.status if r1 else 'missing'}, expected ok (and silently wrong)"]
    if not r1.value["error"] > 1e-3:
        return [f"rank 1's mean is off by {r1.value['error']:.3g}, expected a wrong mean"]
    return []


def _names_both_shapes(result):
    return [f"rank {r.rank} does not name both shapes" for r in result.ranks
            if r.error and not ("TensorShape=[4]" in r.error.message and "TensorShape=[3]" in r.error.message)]


# -- variants ---------------------------------------------------------------------------------

def _init(expect, **kwargs):
    return Variant(init_group, expect, kwargs=kwargs, init_process_group=False, timeout=20, grace=2)


INIT_BROKEN = _init(Expect("error", "DistStoreError", STORE_TIMEOUT, ranks=(0, 1),
                           extra=_key_waited_for(2)), config_world_size=3)
# The same wrong world size with no timeout on init_process_group: nothing but a hang.
INIT_SILENT = Variant(init_group, Expect("timeout", match="init_process_group", ranks=(0, 1)),
                      kwargs={"config_world_size": 3, "timeout_s": None}, init_process_group=False,
                      timeout=3)
# Both processes claim rank 0: both wait for rank 1's key.
INIT_DUPLICATE_RANK = _init(Expect("error", "DistStoreError", STORE_TIMEOUT, ranks=(0, 1),
                                   extra=_key_waited_for(1)), config_rank=0)

# The hang declarations below are gloo's: a gloo collective blocks until every rank has called
# it, so a stopped rank's stack shows the collective it waits in. On NCCL they hold only with
# TORCH_NCCL_BLOCKING_WAIT=1 (BLOCKING); without it rank 0 passes all_reduce and waits at its
# next synchronisation (loss.item()), or NCCL's watchdog aborts the group at its timeout.
REPORT_BROKEN = Variant(train_and_report, Expect("timeout", match="in all_reduce", ranks=(0,),
                                                 extra=_stack_of(1, "in forward")),
                        kwargs={"report": report_on_rank0}, env=BLOCKING, timeout=4)
# The source document's cure: a barrier after the report. Rank 1 now waits in the barrier.
WITH_BARRIER = replace(REPORT_BROKEN, kwargs={"report": report_on_rank0, "barrier": True},
                       expect=Expect("timeout", match="in all_reduce", ranks=(0,),
                                     extra=_stack_of(1, "in barrier")))

MISMATCH_BROKEN = Variant(evaluate, Expect("error", "RuntimeError", "Connection closed by peer",
                                           ranks=(0,), extra=_rank1_silently_wrong),
                          kwargs={"shard_sizes": (4, 3)}, timeout=20, grace=2)
MISMATCH_DETAIL = replace(MISMATCH_BROKEN, env=DETAIL, expect=Expect(
    "error", "RuntimeError", "Detected mismatch between collectives on ranks", ranks=(0, 1),
    extra=_names_both_shapes))

# monitored_barrier is gloo's only (uneven_epoch makes a gloo group for it on NCCL).
MONITORED_BROKEN = Variant(uneven_epoch, Expect("error", "RuntimeError",
                                                r"Rank 1 failed to pass monitoredBarrier in 3000 ms",
                                                ranks=(0,)),
                           kwargs={"batches": (2, 3), "barrier": "monitored"}, timeout=20, grace=3)
PLAIN_BARRIER = Variant(uneven_epoch, Expect("timeout", match="in barrier", ranks=(0,),
                                             extra=_stack_of(1, "in all_reduce")),
                        kwargs={"batches": (2, 3), "barrier": "plain"}, env=BLOCKING, timeout=4)


LESSON = Lesson(
    id="03",
    error_class="process groups and deadlocks",
    title="Process groups, hangs and deadlocks",
    notebook="03_process_groups_and_deadlocks",
    figures=figures,
    scenarios=[
        Scenario("init_wrong_world_size", "A process group that can never form",
                 broken=INIT_BROKEN, fixed=_init(Expect("ok", metric="sum", above=1.5, below=2.5)),
                 summary="world_size=3 with 2 processes: with a 3 s timeout, init_process_group "
                         "raises instead of hanging; take rank and world size from the launcher"),
        Scenario("collective_on_rank0", "An all_reduce only rank 0 calls, to print the loss",
                 broken=REPORT_BROKEN,
                 fixed=Variant(train_and_report,
                               Expect("ok", extra=printed_on_rank0_only(3)),
                               kwargs={"report": report_on_every_rank}, timeout=30),
                 summary="rank 0 waits in all_reduce, rank 1 in DDP's next forward; a barrier "
                         "does not help; every rank all-reduces, only rank 0 prints"),
        Scenario("mismatched_collectives", "Per-sample losses all-reduced from uneven shards",
                 broken=MISMATCH_BROKEN,
                 fixed=Variant(evaluate, Expect("ok", metric="error", below=1e-6, metric_rank=None),
                               kwargs={"shard_sizes": (4, 3), "summary": True}),
                 summary="shapes 4 and 3: a misleading peer error on one rank, a wrong mean on "
                         "the other; DETAIL names both shapes; all-reduce (sum, count) instead"),
        Scenario("monitored_barrier", "A rank that never reaches the end-of-epoch barrier",
                 broken=MONITORED_BROKEN,
                 fixed=Variant(uneven_epoch, Expect("ok"),
                               kwargs={"batches": (3, 3), "barrier": "monitored"}),
                 summary="rank 1 has one more batch; monitored_barrier names it after 3 s where "
                         "barrier() just hangs; give every rank the same number of batches"),
    ],
)
