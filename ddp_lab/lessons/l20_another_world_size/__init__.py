"""Lesson 20: the same job at another world size. A per-rank batch kept while the world grows (and
the linear learning-rate rule), a script written for `torch.distributed.launch` under that launcher
and under torchrun, a job resumed mid-epoch at another world size, accumulation chosen from the
world size.

`runs` holds the training loop and the single process every run is measured against,
`runs_launchers` the launchers' agents (their workers run `runs_script.py`), `runs_resume` the two
jobs of a resume, `figures` the pictures.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass

from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import figures
from .runs import (GLOBAL_BATCH, LR, SAMPLES, accumulate, accumulation_steps, dataset, epoch_loss,
                   my_indices, same_job_at, single_process, train_epoch, tuned_on_one_process)
from .runs_launchers import run_script
from .runs_resume import (BATCH, STEPS_BEFORE, count, first_job, reshard_the_rest, resumed_job,
                          skip_steps)
from .runs_script import local_rank, local_rank_parser

__all__ = ["LESSON", "Resumed", "GLOBAL_BATCH", "LR", "SAMPLES", "accumulate", "accumulation_steps",
           "dataset", "epoch_loss", "my_indices", "same_job_at", "single_process", "train_epoch",
           "tuned_on_one_process", "run_script", "BATCH", "STEPS_BEFORE", "count", "first_job",
           "reshard_the_rest", "resumed_job", "skip_steps", "local_rank", "local_rank_parser",
           "workers_of", "figures"]


@dataclass(frozen=True)
class Resumed(Variant):
    """A job and its resumption: `first_job` at `first_world` ranks, then this variant's own
    function (the resumed job) at `world_size`, both given the same fresh folder (`workdir=`,
    removed afterwards). The result is the resumed job's, with the first's in `result.earlier`.
    `run(first_world=N)` starts the first job at N ranks instead."""

    first_world: int = 4

    def run(self, *, world_size=None, timeout=None, label="", first_world=None, **kwargs):
        with tempfile.TemporaryDirectory(prefix="ddp-lab-l20-") as workdir:
            first = Variant(first_job, Expect("ok"), world_size=first_world or self.first_world)
            before = first.run(label=f"{label} (first job)", workdir=workdir)
            if first.expect.differences(before):
                before.earlier = []
                return before
            result = super().run(world_size=world_size, timeout=timeout, label=label,
                                 workdir=workdir, **kwargs)
        result.earlier = [before]
        return result


def workers_of(rank) -> list[dict]:
    """What the launcher's workers wrote, as `run_script` printed it on the rank's stdout."""
    for line in rank.stdout.splitlines():
        if line.startswith("workers: "):
            return json.loads(line[len("workers: "):])
    return []


def _every_worker_refused(result) -> list[str]:
    """Each worker exited 2 with argparse's "unrecognized arguments: --local-rank=<its rank>"."""
    workers = workers_of(result.ranks[0])
    if len(workers) != 2:
        return [f"{len(workers)} workers reported, expected 2"]
    return [f"worker {w['rank']} said {w.get('said')!r}" for w in workers
            if w.get("exit") != 2 or not w.get("said", "").endswith(
                f"error: unrecognized arguments: --local-rank={w['env_local_rank']}")]


def _local_ranks(expected: list[int]):
    def problems(result):
        got = result.values[0]["local_ranks"]
        return [] if got == expected else [f"the script read local ranks {got}, expected {expected}"]
    return problems


# Scenario 1 runs on 4 ranks: world 1 is rank 0 alone, world 2 ranks 0 and 1 (a group of their
# own), world 4 all; `gap` is the largest |epoch loss - the single process's| over worlds 2 and 4.
# Measured here: 1.1 (world 2) and 3.2 (world 4) broken; 0.0 fixed (float32, the same sums).
def _script(expect: Expect, launcher: str, parser: str) -> Variant:
    """runs_script.py under `launcher`, reading its local rank the `parser` way: one launched rank
    with no process group of its own, where the launcher's agent and its 2 workers run."""
    return Variant(run_script, expect, kwargs={"launcher": launcher, "parser": parser},
                   world_size=1, init_process_group=False, timeout=120)


def _worlds(**kwargs) -> dict:
    return {"world_size": 4, "kwargs": kwargs, "timeout": 60}


LESSON = Lesson(
    id="20",
    error_class="the same job at another world size",
    title="The same job at another world size",
    notebook="20_another_world_size",
    figures=figures,
    scenarios=[
        Scenario("per_rank_batch", "World size 1, 2, 4 with the per-rank batch kept",
                 broken=Variant(same_job_at, Expect("ok", metric="gap", above=0.3),
                                **_worlds(per_rank_batch=GLOBAL_BATCH)),
                 fixed=Variant(same_job_at, Expect("ok", metric="gap", below=1e-4), **_worlds()),
                 summary="each rank still takes 16 samples, so the global batch is 16 x world and an "
                         "epoch has 1/world the steps: the loss ends far from one process's; keep "
                         "the global batch (per-rank = 16 / world)"),
        Scenario("old_launcher_flag", "A --local_rank script under torch.distributed.launch",
                 broken=_script(Expect("error", "ChildFailedError", r"exitcode\s*: 2", ranks=(0,),
                                       extra=_every_worker_refused), "launch", "underscore"),
                 fixed=_script(Expect("ok", metric="misread", below=0.5, extra=_local_ranks([0, 1])),
                               "launch", "both"),
                 summary="the launcher passes --local-rank (dashed) since torch 2.0: argparse exits 2 "
                         "on every worker; accept both spellings"),
        Scenario("torchrun_local_rank", "The same script under torchrun",
                 broken=_script(Expect("ok", metric="misread", above=0.5, extra=_local_ranks([0, 0])),
                                "torchrun", "underscore"),
                 fixed=_script(Expect("ok", metric="misread", below=0.5, extra=_local_ranks([0, 1])),
                               "torchrun", "env"),
                 summary="torchrun passes no --local-rank: the default 0 on every rank, silently "
                         "(two ranks on one GPU); read LOCAL_RANK"),
        Scenario("resume_elsewhere", "A job checkpointed at 4 ranks, resumed at 2",
                 broken=Resumed(resumed_job, Expect("ok", metric="misplaced", above=10),
                                kwargs={"place": skip_steps}),
                 fixed=Resumed(resumed_job, Expect("ok", metric="misplaced", below=0.5),
                               kwargs={"place": reshard_the_rest}),
                 summary="skipping the saved number of steps per rank skips another number of "
                         "samples at another world size: 48 seen twice; save the samples consumed "
                         "and shard the rest of the epoch's order over the new ranks"),
        Scenario("accumulation_from_world", "Accumulation steps tuned on one process, run on 2",
                 broken=Variant(accumulate, Expect("ok", metric="gap", above=0.3),
                                kwargs={"steps_for": tuned_on_one_process}),
                 fixed=Variant(accumulate, Expect("ok", metric="gap", below=1e-4),
                               kwargs={"steps_for": accumulation_steps}),
                 summary="4 micro-batches of 4 per rank made 16 on one process and make 32 on 2 "
                         "ranks; take the steps from the world size: 16 / (4 x world)"),
    ],
)
