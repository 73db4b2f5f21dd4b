"""Lesson 00: how ranks are launched and read, and the source document's own example, run and fixed."""
from __future__ import annotations

from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import figures
from .runs import (SOURCE_EXAMPLE, SOURCE_FIXES, all_reduce_hello, exit_mid_run, metric_on_rank0_only,
                   run_source_example, source_example, source_fix_diff, train_on_shards)

# What each step of the source example does on a machine without a GPU (gloo). Steps 1 and 3
# fail differently on the two builds of torch a plain install gives:
SOURCE_STEPS = [
    Expect("error", "NameError", r"name 'nn' is not defined", ranks=(0, 1)),
    # init_process_group("nccl"): the CPU build (pinned) has no NCCL at all, "RuntimeError:
    # Distributed package doesn't have NCCL built in"; the CUDA build has NCCL but no GPU,
    # "ValueError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!".
    Expect("error", "RuntimeError|ValueError", r"Distributed package doesn't have NCCL built in|"
           r"ProcessGroupNCCL is only supported with GPUs, no GPUs found", ranks=(0, 1)),
    Expect("error", "NameError", r"name 'rank' is not defined", ranks=(0, 1)),
    # .cuda(rank): the CPU build, "RuntimeError: Cannot access accelerator device when none is
    # available."; the CUDA build without a driver, "RuntimeError: Found no NVIDIA driver on
    # your system. ..." (what CUDA's own initialisation says).
    Expect("error", "RuntimeError", r"Cannot access accelerator device when none is available|"
           r"Found no NVIDIA driver on your system", ranks=(0, 1)),
    Expect("error", "NotImplementedError", r'missing the required "forward" function', ranks=(0, 1)),
    Expect("ok", metric="loss_drop", above=0.2),
]


def _source_variant(fixes: int) -> Variant:
    return Variant(run_source_example, SOURCE_STEPS[fixes], kwargs={"fixes": fixes},
                   init_process_group=False, timeout=30)


LESSON = Lesson(
    id="00",
    error_class="launching ranks",
    title="Launching ranks and reading them",
    notebook="00_launching_ranks",
    figures=figures,
    scenarios=[
        Scenario("one_rank_raises", "One rank raises while the other waits in a collective",
                 broken=Variant(train_on_shards, Expect("error", "RuntimeError",
                                r"mat1 and mat2 shapes cannot be multiplied", ranks=(1,)),
                                kwargs={"features_per_rank": (10, 12)}, grace=2),
                 fixed=Variant(train_on_shards, Expect("ok"), kwargs={"features_per_rank": (10, 10)}),
                 summary="rank 1's shard has 12 columns: its forward fails, rank 0 is left waiting"),
        # gloo's: its collectives block until every rank has called them, so the stack shows rank 0
        # inside all_reduce. NCCL's return once queued: rank 0 would pass all_reduce and hang at the
        # next synchronisation (metric.item()), or be aborted by NCCL's watchdog.
        Scenario("collective_on_one_rank", "A collective only rank 0 calls: a hang, made a timeout",
                 broken=Variant(metric_on_rank0_only, Expect("timeout", match="in all_reduce", ranks=(0,)),
                                timeout=3),
                 fixed=Variant(metric_on_rank0_only, Expect("ok"), kwargs={"everyone": True}),
                 summary="every rank must call every collective; only the printing is rank 0's"),
        Scenario("rank_exits", "A rank exits without a Python exception: a crash",
                 broken=Variant(exit_mid_run, Expect("crashed", match="status 3", ranks=(1,)), grace=2),
                 fixed=Variant(exit_mid_run, Expect("ok"), kwargs={"exit_rank": None}),
                 summary="a rank that leaves with os._exit(3) is reported as crashed, with its status"),
        Scenario("source_example", "The source document's example: as written, then corrected",
                 broken=_source_variant(0), fixed=_source_variant(len(SOURCE_FIXES)),
                 summary="five fixes take it from NameError to a device-agnostic DDP training run"),
    ],
)
