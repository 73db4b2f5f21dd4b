"""Lesson 13: the hangs real jobs hit, found with PyTorch's flight recorder -- evaluation on
rank 0 through the DDP wrapper, a slow rank-0 checkpoint save, ranks that stop after different
numbers of steps, and a collective whose size differs between ranks.

Declarations that rely on gloo's behaviour say so: gloo's collectives block until every rank
called them, so a missing collective is a hang right there. NCCL's return once queued; the hang
shows at the next synchronisation (`.item()`, `cuda.synchronize`) or as its watchdog's abort
after the process group's timeout, when the watchdog also writes each rank's record to
`TORCH_FR_DUMP_TEMP_FILE` + rank (`TORCH_NCCL_DUMP_ON_TIMEOUT` defaults to on in PyTorch's
ProcessGroupNCCL.cpp; not run here: this build has no NCCL). torch records by default
(`TORCH_FR_BUFFER_SIZE`, 2000 entries); the launcher brings every rank's record back.

`modules` holds the model, `runs` what each rank runs, `figures` the picture.
"""
from __future__ import annotations

from ...launching.divergence import find
from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import entry_gap, figures
from .modules import Classifier
from .runs import (broadcast_vocabulary, buffer_broadcasts_per_forward, evaluate, local_loss,
                   save_checkpoint_slowly, torch_analyser, train_and_evaluate_on_rank0,
                   train_with_early_stopping, train_with_rank0_save)

HANG = 2.0  # seconds: a deliberate hang is reported this soon
PG_TIMEOUT, SAVE = 1.0, 2.0  # seconds: the process group's timeout, and how long rank 0 saves
DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}  # wraps the group only when set at its creation


def parts_at(kind: str, ops: tuple[str, ...]):
    """An Expect check: the flight recorder shows the ranks part by `kind`, rank r in ops[r]
    ("-": rank r never entered it)."""
    def problems(result) -> list[str]:
        p = find(result.ranks)
        if p is None:
            return ["the flight recorder shows no collective where the ranks part"]
        seen = tuple(c.op if c else "-" for c in p.entries.values())
        if p.kind != kind or seen != ops:
            return [f"the ranks part at #{p.seq} by {p.kind} {seen}, expected {kind} {ops}"]
        return []
    return problems


def entered_late(seconds: float):
    """An Expect check: one rank entered the last common collective `seconds` after another."""
    def problems(result) -> list[str]:
        gap = entry_gap(result)
        return [] if gap > seconds else [f"the ranks entered their last collective {gap:.1f} s "
                                         f"apart, expected > {seconds:g} s"]
    return problems


def no_parting(result) -> list[str]:
    p = find(result.ranks)
    return [f"the ranks part at collective #{p.seq} ({p.kind})"] if p else []


def same_steps(result) -> list[str]:
    steps = [v["steps"] for v in result.values]
    return [] if len(set(steps)) == 1 else [f"the ranks ran {steps} steps"]


LESSON = Lesson(
    id="13",
    error_class="hangs: collectives the ranks do not all make",
    title="Hangs found in seconds: the flight recorder",
    notebook="13_hangs",
    figures=figures,
    scenarios=[
        Scenario(
            "rank0_evaluation", "Evaluation on rank 0 through the DDP wrapper",
            # gloo's: the broadcast blocks until rank 1 joins. NCCL: the broadcast is queued and
            # the hang shows at the next sync, or as the watchdog's abort.
            broken=Variant(train_and_evaluate_on_rank0, timeout=HANG, expect=Expect(
                "timeout", match="_sync_buffers", ranks=(0,),
                extra=parts_at("op", ("broadcast", "barrier")))),
            fixed=Variant(train_and_evaluate_on_rank0, kwargs={"through_wrapper": False},
                          expect=Expect("ok", extra=no_parting)),
            summary="the first forward after a training step broadcasts DDP's buffers from rank "
                    "0, a collective rank 1 never makes; evaluate ddp_model.module (or evaluate "
                    "on every rank and reduce)"),
        Scenario(
            "slow_rank0_save", "A slow rank-0 save past the process group's timeout",
            # gloo's words: "Timed out waiting 1000ms for recv" (PG_TIMEOUT). NCCL: the watchdog
            # aborts the communicator after the timeout ("Watchdog caught collective operation
            # timeout").
            broken=Variant(train_with_rank0_save, init_process_group=False, timeout=20,
                           kwargs={"pg_timeout": PG_TIMEOUT, "save_seconds": SAVE},
                           expect=Expect("error", "RuntimeError", "Timed out waiting", ranks=(1,),
                                         extra=entered_late(SAVE - PG_TIMEOUT))),
            fixed=Variant(train_with_rank0_save, init_process_group=False, timeout=20,
                          kwargs={"wait_in_barrier": True, "pg_timeout": PG_TIMEOUT,
                                  "save_seconds": SAVE},
                          expect=Expect("ok", metric="steps", above=2.5, extra=no_parting)),
            summary="rank 1 waits in the next all_reduce past the group's timeout; wait for the "
                    "save in a barrier on a group whose timeout covers it"),
        Scenario(
            "uneven_steps", "Early stopping decided on each rank",
            # gloo's: rank 0's barrier and rank 1's all_reduce both block (NCCL: both queue, and
            # the job hangs or aborts later).
            broken=Variant(train_with_early_stopping, timeout=HANG, expect=Expect(
                "timeout", match="barrier", ranks=(0,),
                extra=parts_at("op", ("barrier", "all_reduce")))),
            fixed=Variant(train_with_early_stopping, kwargs={"agree": True},
                          expect=Expect("ok", extra=lambda r: same_steps(r) + no_parting(r))),
            summary="rank 0 stops after 3 steps, rank 1 trains on; all_reduce the stop flag "
                    "(MAX) so every rank stops at the same step"),
        Scenario(
            "mismatched_broadcast", "A broadcast whose size differs between ranks",
            # gloo's: returns without an error, rank 1's tensor half overwritten (sizes that
            # differ in an all_reduce make gloo abort instead). NCCL: undefined -- a hang, a
            # crash or garbage.
            broken=Variant(broadcast_vocabulary, timeout=20, expect=Expect(
                "ok", metric="wrong", metric_rank=1, above=0.5,
                extra=parts_at("size", ("broadcast", "broadcast")))),
            fixed=Variant(broadcast_vocabulary, timeout=20, kwargs={"send_length_first": True},
                          expect=Expect("ok", metric="wrong", metric_rank=None, below=0.5,
                                        extra=no_parting)),
            summary="rank 1 receives 4 values into 8 and keeps 4 stale ones, silently; broadcast "
                    "the length first"),
    ],
)

__all__ = ["LESSON", "DETAIL", "HANG", "PG_TIMEOUT", "SAVE", "entry_gap", "Classifier", "broadcast_vocabulary",
           "buffer_broadcasts_per_forward", "torch_analyser", "evaluate",
           "local_loss", "save_checkpoint_slowly", "train_and_evaluate_on_rank0",
           "train_with_early_stopping", "train_with_rank0_save", "figures", "parts_at"]
