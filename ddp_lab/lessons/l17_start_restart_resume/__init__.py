"""Lesson 17: starting, restarting and resuming. Two jobs on one port, an address never reached,
ranks counted per node, an elastic restart, a resume that restores only part of the state, a
checkpoint cut mid-write, every rank preparing the data.

Scenarios 1, 3 and 4 run torchrun's agent in a launched rank (`runs_agents.py`; its workers are
`runs_torchrun.py`); 5 and 6 are a job and its restart, several launches in a row (`Restarted`).
The picture is in `figures.py`.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace

from ...launching.launcher import launch
from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import figures, resume_figure, restart_figure
from .runs_agents import elastic_job, second_job, summarise_shards, torchrun, two_nodes
from .runs_cache import every_rank_prepares, prepare_and_load, rank0_prepares
from .runs_checkpoints import (latest_complete, latest_file, resume, save_atomically, save_in_place,
                               train_and_checkpoint)
from .runs_rendezvous import UNREACHABLE, join
from .runs_resume import (everything, first_half, gather, model_only, restore, resumed, rng_state,
                          straight)
from .runs_torchrun import shard_and_device

__all__ = ["LESSON", "Restarted", "PEER_NEVER_CAME", "restart_with_torchruns_defaults", "UNREACHABLE",
           "elastic_job", "second_job", "summarise_shards", "torchrun", "two_nodes",
           "every_rank_prepares", "prepare_and_load", "rank0_prepares", "latest_complete",
           "latest_file", "resume", "save_atomically", "save_in_place", "train_and_checkpoint",
           "join", "everything", "first_half", "gather", "model_only", "restore", "resumed",
           "rng_state", "straight",
           "shard_and_device", "figures", "resume_figure", "restart_figure", "ended_after",
           "keys_at_start", "restart_found_old_keys", "WRITE_FAILS", "cut_with_pythons_handler",
           "FULL_STATE", "what_the_checkpoint_lacks"]


@dataclass(frozen=True)
class Restarted(Variant):
    """A job and its restart: the `before` launches run first, one after another, then this
    variant's own. All get the same fresh folder (`workdir=`, removed afterwards) and this
    variant's keyword arguments with those given to `run` (the learner's). The result is the
    last launch's, with the earlier ones in `result.earlier`. An earlier launch that is
    not as declared ends the sequence and is the result: what came after would start from a
    state nobody declared."""

    before: tuple[Variant, ...] = ()

    def run(self, *, world_size=None, timeout=None, label="", **kwargs):
        every = {**self.kwargs, **kwargs}
        earlier = []
        with tempfile.TemporaryDirectory(prefix="ddp-lab-l17-") as workdir:
            for i, v in enumerate(self.before):
                run = v.run(world_size=world_size, label=f"{label} (launch {i + 1})",
                            workdir=workdir, **every)
                if v.expect.differences(run):
                    run.earlier = earlier
                    return run
                earlier.append(run)
            result = super().run(world_size=world_size, timeout=timeout, label=label,
                                 workdir=workdir, **kwargs)
        result.earlier = earlier
        return result


# -- reading runs back ----------------------------------------------------------------------------

def ended_after(rank) -> float:
    """The seconds a rank said its step took ("... ended after 1.234 s" on its stdout)."""
    found = re.findall(r"ended after (\d+\.\d+) s", rank.stdout)
    return float(found[-1]) if found else float("inf")


def keys_at_start(rank) -> dict[str, bool]:
    """{"attempt/rank": whether that torchrun worker found its own key in the store before it
    joined} (printed by `elastic_job`, so a job torchrun failed still tells)."""
    found = re.findall(r"own key in the store before joining: (\{.*\})", rank.stdout)
    return json.loads(found[-1]) if found else {}


# -- extra checks (RunResult -> list of problems) -------------------------------------------------

def _within(seconds: float, rank: int = 0):
    def problems(result):
        took = ended_after(result.ranks[rank])
        return [] if took < seconds else [f"rank {rank}'s step took {took:.1f} s, expected < {seconds:g} s"]
    return problems


def _ports_differ(result):
    v = result.ranks[0].value
    return [] if v["second_port"] not in (None, v["first_port"]) else ["job B did not get a port of its own"]


def _gpus_out_of_range(n: int):
    def problems(result):
        got = result.ranks[0].value["gpu_out_of_range"]
        return [] if got == n else [f"{got} ranks take a GPU their node lacks, expected {n}"]
    return problems


def _every_rank_restarted(result):
    v = result.ranks[0].value
    problems = [] if v["attempts"] == [0, 1] else [f"attempts {v['attempts']}, expected [0, 1]"]
    problems += [] if v["restarted_ranks"] == [0, 1] else [f"restarted ranks {v['restarted_ranks']}, expected both"]
    return problems + ([] if v["completed"] else ["the job did not run every step"])


def _bit_for_bit(result):
    return [f"rank {r.rank}'s resumed run is not the straight run's, bit for bit" for r in result.ranks
            if not r.value["identical"]]


def _one_build_per_round(result):
    v = result.ranks[0].value
    return [] if v["builds"] == v["rounds"] and not v["torn_loads"] else \
        [f"{v['builds']} builds and {v['torn_loads']} torn loads in {v['rounds']} rounds"]


def _before(*expects: Expect):
    """The earlier launches of a `Restarted` variant, each as declared."""
    def problems(result):
        runs = result.earlier
        if len(runs) != len(expects):
            return [f"{len(runs)} earlier launches, expected {len(expects)}"]
        return [f"launch {i + 1}: {p}" for i, (e, run) in enumerate(zip(expects, runs)) for p in e.differences(run)]
    return problems


def _both(*checks):
    def problems(result):
        return [p for c in checks for p in c(result)]
    return problems


# -- variants -------------------------------------------------------------------------------------

EADDRINUSE = r"failed to listen on any local network address.*EADDRINUSE"
NOT_REACHED = r"The client socket has timed out after \d+ms while trying to connect to \(192\.0\.2\.1, \d+\)"
TORN = r"PytorchStreamReader failed reading zip archive: failed finding central directory"

# Linux's: the kernel ends the process that writes past its file-size limit (SIGXFSZ).
CUT = Expect("crashed", match="SIGXFSZ", ranks=(0,))
STRAIGHT, FIRST_HALF = Variant(straight, Expect("ok")), Variant(first_half, Expect("ok"))


def _agent(fn, expect, world_size=1, **kwargs) -> Variant:
    """A launched rank that runs torchrun's agent: the workers' imports are inside its time."""
    return Variant(fn, expect, kwargs=kwargs, world_size=world_size, init_process_group=world_size > 1,
                   timeout=240, grace=2)


def _and_before(expect: Expect, *earlier: Expect) -> Expect:
    """`expect`, and the earlier launches of a `Restarted` variant as `earlier` declares them."""
    return replace(expect, extra=_both(_before(*earlier), *([expect.extra] if expect.extra else [])))


def _resume(expect: Expect, state_of) -> Restarted:
    return Restarted(resumed, _and_before(expect, STRAIGHT.expect, FIRST_HALF.expect),
                     kwargs={"state_of": state_of}, before=(STRAIGHT, FIRST_HALF))


def _torn(expect: Expect, save, pick) -> Restarted:
    cut = Variant(train_and_checkpoint, CUT, kwargs={"save": save}, grace=2)
    return Restarted(resume, _and_before(expect, CUT), kwargs={"pick": pick}, before=(cut,), grace=2)


# Scenario 2, a peer that never came: the store answers, a key never appears. Told apart from an
# address never reached by the message alone.
PEER_NEVER_CAME = Variant(join, Expect("error", "DistStoreError",
                                       r"wait timeout after \d+ms, keys: /default_pg/\S*/1$", ranks=(0,)),
                          kwargs={"absent_rank": 1}, init_process_group=False, grace=3)


# Scenario 4 with torchrun's defaults, on torch 2.13: the agent keeps the store it shares with
# the workers across restarts (dynamic_rendezvous.py), so the restarted workers find the first
# attempt's keys, their addresses, in it (pytorch#135712; #167288 with NCCL). Whether gloo then
# connects to a dead port, and the restart fails, depends on which worker reads first: timing.
# So no outcome is declared, only the keys (`restart_found_old_keys`).
def restart_with_torchruns_defaults():
    """Scenario 4's job (no resume) with the store torchrun's agent shares with its workers."""
    return launch(elastic_job, world_size=1, init_process_group=False, timeout=240, grace=2,
                  label="17/elastic_restart, torchrun's defaults", shared_store=True, pg_timeout=2.0)


def restart_found_old_keys(result) -> list[str]:
    """What differs from torch 2.13's shared store across a restart: every restarted worker
    found its own key (its address) in the store before it joined, and no first-attempt worker
    did; the job then either completed or failed in gloo's connect, nothing else."""
    keys = keys_at_start(result.ranks[0])
    want = {"0/0": False, "0/1": False, "1/0": True, "1/1": True}
    problems = [] if keys == want else [f"own keys found before joining {keys}, expected {want}"]
    r = result.ranks[0]
    if r.status == "error" and not (r.error.type == "ChildFailedError"
                                    and "Gloo connectFullMesh failed" in r.error.message):
        problems.append(f"the job failed otherwise: {r.headline}")
    elif r.status not in ("ok", "error"):
        problems.append(f"the agent's rank is {r.status}: {r.headline}")
    return problems


# Scenario 6 as a script of one's own meets it: CPython ignores SIGXFSZ, so the kernel refuses the
# write past the limit (EFBIG) instead of killing the rank, and torch.save raises: its C++ writer's
# failed write (serialization.py:1312), then, raised last as the `with` closes the zip,
# "unexpected pos" (serialization.py:834, inline_container.cc). The file left is as torn as a
# kill leaves it.
WRITE_FAILS = Variant(train_and_checkpoint, Expect("error", "RuntimeError", r"unexpected pos \d+ vs \d+",
                                                   ranks=(0,)), kwargs={"kill": False}, grace=2)


def cut_with_pythons_handler():
    """Launch 1 of scenario 6 with SIGXFSZ left as CPython sets it, in a folder of its own.
    Returns the run and {file: size} of what it left."""
    with tempfile.TemporaryDirectory(prefix="ddp-lab-l17-") as workdir:
        run = WRITE_FAILS.run(label="17/torn_checkpoint, SIGXFSZ as CPython leaves it", workdir=workdir)
        return run, {f: os.path.getsize(os.path.join(workdir, f)) for f in sorted(os.listdir(workdir))}


# -- the exercise --------------------------------------------------------------------------------

FULL_STATE = ("model", "optimizer", "scheduler", "step", "epoch", "position", "rng")  # `everything`'s


def what_the_checkpoint_lacks(verdict) -> str:
    """One line for the exercise's learner: the error a rank raised (restoring a checkpoint, or
    making one), else the keys of `everything` that the learner's checkpoint lacks."""
    result = verdict.result
    if result.status != "ok":
        root = result.root_cause
        return f"rank {root.rank}: {root.headline}" if root else result.describe_failure().splitlines()[0]
    saved = set(result.earlier[1].values[0]["saved"])  # launch 2 made the checkpoint
    missing = [k for k in FULL_STATE if k not in saved]
    if missing:
        return "the checkpoint lacks: " + ", ".join(missing)
    return "every key is there" + ("" if verdict.passed else "; check what each one holds")


LESSON = Lesson(
    id="17",
    error_class="starting, restarting and resuming",
    title="Starting, restarting and resuming",
    notebook="17_start_restart_resume",
    figures=figures,
    scenarios=[
        Scenario("two_jobs_one_port", "A second job started with the first job's MASTER_PORT",
                 broken=_agent(second_job, Expect("error", "DistNetworkError", EADDRINUSE, ranks=(0,),
                                                  extra=_within(10.0)), world_size=2, own_port=False),
                 fixed=_agent(second_job, Expect("ok", extra=_ports_differ), world_size=2, own_port=True),
                 summary="torchrun's store cannot bind the port job A's store holds: EADDRINUSE at "
                         "once; give each job its own port (--standalone: the kernel picks one)"),
        Scenario("unreachable_address", "MASTER_ADDR points where no store listens",
                 broken=Variant(join, Expect("error", "DistNetworkError", NOT_REACHED, ranks=(0, 1)),
                                kwargs={"master_addr": UNREACHABLE}, init_process_group=False, grace=5),
                 fixed=Variant(join, Expect("ok", metric="sum", above=1.5, below=2.5),
                               init_process_group=False),
                 summary="with a 1 s timeout every rank raises, naming the address it could not "
                         "reach; the default would wait 30 min (gloo); give the right address"),
        Scenario("ranks_per_node", "Two nodes: data sharded by LOCAL_RANK, GPUs chosen by RANK",
                 broken=_agent(two_nodes, Expect("ok", metric="duplicated", above=0.45,
                                                 extra=_gpus_out_of_range(2)), world_size=2,
                               by_local_rank=True),
                 fixed=_agent(two_nodes, Expect("ok", metric="duplicated", below=0.01,
                                                extra=_gpus_out_of_range(0)), world_size=2,
                              by_local_rank=False),
                 summary="both nodes train on the same two shards and half the data is never seen; "
                         "ranks 2 and 3 take GPUs 2 and 3 of 2; RANK for data, LOCAL_RANK for devices"),
        Scenario("elastic_restart", "torchrun --max-restarts 1, a rank killed at step 5",
                 broken=_agent(elastic_job, Expect("ok", metric="repeated", above=4.5,
                                                   extra=_every_rank_restarted), resume=False),
                 fixed=_agent(elastic_job, Expect("ok", metric="repeated", below=1.5,
                                                  extra=_every_rank_restarted), resume=True),
                 summary="every rank is restarted, and a script that does not resume runs steps 0-4 "
                         "again; resume from the last complete checkpoint (one step repeated)"),
        Scenario("partial_resume", "A checkpoint that holds only the model",
                 broken=_resume(Expect("ok", metric="departure", above=1e-3), model_only),
                 fixed=_resume(Expect("ok", metric="departure", below=1e-30, extra=_bit_for_bit),
                               everything),
                 summary="the loss departs from the straight run's after the restart; save the "
                         "optimizer, scheduler, sampler epoch and position, every rank's RNGs and the "
                         "step: bit for bit"),
        Scenario("torn_checkpoint", "Rank 0 killed while it writes a checkpoint",
                 broken=_torn(Expect("error", "RuntimeError", TORN, ranks=(0, 1)), save_in_place,
                              latest_file),
                 fixed=_torn(Expect("ok", metric="resumed_from", above=3.5, below=4.5), save_atomically,
                             latest_complete),
                 summary="the newest file is half a zip: torch.load fails on every rank; write to a "
                         "temporary name and rename, resume from the newest checkpoint that loads"),
        Scenario("every_rank_prepares", "Every rank builds the dataset cache into one path",
                 broken=Variant(prepare_and_load, Expect("ok", metric="raced", above=0.5),
                                kwargs={"prepare": every_rank_prepares}),
                 fixed=Variant(prepare_and_load, Expect("ok", metric="raced", below=0.5,
                                                        extra=_one_build_per_round),
                               kwargs={"prepare": rank0_prepares}),
                 summary="ranks build the same file at once: work done twice, torn files read; "
                         "rank 0 builds, the others wait at a barrier"),
    ],
)
