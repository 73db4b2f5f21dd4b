"""Scenarios 1, 3 and 4 start torchrun: its agent runs here, in a launched rank (as a shell's
`torchrun ...` would run it on a node), and starts its workers (`runs_torchrun.py`). The launcher
stops the rank, and with it the agent, at its timeout; the workers die with the agent.

Under torchrun itself (`torchrun -m ddp_lab run 17 ...`) these scenarios refuse, saying so:
torchrun's agent inside one of torchrun's own workers is not a job anyone runs."""
from __future__ import annotations

import glob
import json
import os
import tempfile
import time

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from ...launching.rankinfo import RANK_VARIABLES, environ, rank_info, scratch_dir
from . import runs_torchrun
from .runs import refuse_under_torchrun, shared_dir
from .runs_torchrun import AGENT_PID

WORKER = runs_torchrun.__file__  # run by its path: see its docstring
SAMPLES = 64  # the data set of scenario 3
STARTS_TORCHRUN = "it starts torchrun itself"




def torchrun(argv: list[str], env: dict | None = None) -> None:
    """`torchrun ARGV` as a shell on this machine would run it, its agent in this process;
    raises what torchrun raises."""
    from torch.distributed.run import main

    with environ({AGENT_PID: str(os.getpid()), **(env or {})}, drop=RANK_VARIABLES):
        main(argv)


# torchrun's own way to start workers without a new interpreter: each is a fork of the agent
# (which has imported torch already) running the script with runpy. Scenario 4 starts four
# workers; this spares each the import of torch, seconds apiece on a small machine.
IN_THE_AGENT = ("--run-path", "--start-method=fork")


def _worker(mode: str, out: str, *args: str) -> list[str]:
    return [WORKER, mode, "--out", out, *args]


# -- scenario 1: two jobs, one port ------------------------------------------------------------

def second_job(own_port: bool = False) -> dict:
    """This launch is job A: its ranks are in a process group whose store listens on
    MASTER_PORT, a port the kernel gave the launcher. Rank 0 starts job B on the same machine,
    with job A's MASTER_PORT (`own_port=False`) or a port of its own (`--standalone`)."""
    refuse_under_torchrun("two_jobs_one_port", STARTS_TORCHRUN)
    first = int(os.environ["MASTER_PORT"])
    second = None
    if rank_info().is_main:
        print(f"job A's store: port {first}")
        where = (["--standalone"] if own_port else
                 [f"--master-addr={os.environ['MASTER_ADDR']}", f"--master-port={first}"])
        with tempfile.TemporaryDirectory(prefix="ddp-lab-l17-", dir=scratch_dir()) as out:
            began = time.monotonic()
            try:
                torchrun([*where, "--nproc-per-node=1", "--max-restarts=0",
                          *_worker("second_job", out)])
            finally:
                print(f"job B ended after {time.monotonic() - began:.3f} s")
            with open(os.path.join(out, "second-job.json")) as f:
                second = json.load(f)["master_port"]
    dist.barrier()  # job A goes on
    return {"first_port": first, "second_port": second}


# -- scenario 3: two nodes, ranks counted per node ---------------------------------------------

def two_nodes(by_local_rank: bool = True) -> dict:
    """Each rank of this launch is a node: it runs torchrun's agent with --nnodes 2
    --nproc-per-node 2. The agents meet at a c10d rendezvous on the store the launcher hosts
    (MASTER_ADDR:MASTER_PORT, a port the kernel chose), as real nodes meet at node 0's."""
    refuse_under_torchrun("ranks_per_node", STARTS_TORCHRUN)
    endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    with shared_dir() as out:
        torchrun(["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint={endpoint}", "--rdzv-id=l17-two-nodes",
                  "--rdzv-conf=is_host=false", "--max-restarts=0",
                  *_worker("shards", out, *(["--by-local-rank"] if by_local_rank else []))])
        dist.barrier()  # both nodes' workers are done
        workers = []
        for path in sorted(glob.glob(os.path.join(out, "worker-*.json"))):
            with open(path) as f:
                workers.append(json.load(f))
    return summarise_shards(workers)


def summarise_shards(workers: list[dict]) -> dict:
    """How many samples more than one rank trains on, how many none does, and which ranks
    would take a GPU their node does not have."""
    seen: dict[int, int] = {}
    for w in workers:  # the samples DistributedSampler gives the shard each worker picked
        for s in DistributedSampler(range(SAMPLES), num_replicas=w["world_size"], rank=w["shard"],
                                    shuffle=True, seed=0):
            seen[s] = seen.get(s, 0) + 1
    return {"workers": [{k: w[k] for k in ("rank", "local_rank", "node", "shard", "gpu")} for w in workers],
            "duplicated": sum(n - 1 for n in seen.values()) / sum(seen.values()),
            "never_seen": (SAMPLES - len(seen)) / SAMPLES,
            "gpu_out_of_range": sum(w["gpu"] >= w["gpus_per_node"] for w in workers)}


# -- scenario 4: an elastic restart ------------------------------------------------------------

# A bug of torch 2.13 (seen here with gloo): on a restart the workers' store is the one the agent
# shared with the first attempt, and still holds its addresses; the restarted workers connect to
# dead ports. Disabling the sharing gives each attempt a fresh store (see the notebook).
FRESH_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def elastic_job(resume: bool = False, shared_store: bool = False, steps: int = 8, every: int = 2,
                die_at: int = 5, pg_timeout: float = 20.0) -> dict:
    """torchrun --standalone --nproc-per-node 2 --max-restarts 1; rank 1 is killed at step
    `die_at` of the first attempt. Returns, per attempt and rank, the steps it ran."""
    refuse_under_torchrun("elastic_restart", STARTS_TORCHRUN)
    with tempfile.TemporaryDirectory(prefix="ddp-lab-l17-", dir=scratch_dir()) as out:
        began = time.time()
        try:
            # --shutdown-timeout: a worker stuck in C++ (gloo's connect) never runs its SIGTERM
            # handler; torchrun SIGKILLs it after this many seconds (default 30). An option since
            # torch 2.12: the course's floor (tools/upgrade_check.py, kit/preflight.py MIN_TORCH)
            torchrun(["--standalone", "--nproc-per-node=2", "--max-restarts=1", "--shutdown-timeout=2",
                      *IN_THE_AGENT,
                      *_worker("elastic", out, f"--steps={steps}", f"--every={every}",
                               f"--die-at={die_at}", f"--pg-timeout={pg_timeout}",
                               *(["--resume"] if resume else []))],
                     env={} if shared_store else FRESH_STORE)
        finally:  # on stdout, so that a job torchrun failed still tells
            print("own key in the store before joining:", json.dumps(stale_keys(out)))
        return summarise_attempts(out, began, steps)


def stale_keys(out: str) -> dict[str, bool]:
    """{"attempt/rank": whether the store already held that worker's own process-group key (its
    address) before it joined}: nobody but the worker writes it, so it is the previous attempt's."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, "stale-*.json"))):
        attempt, rank = os.path.basename(path)[len("stale-"):-len(".json")].split("-")
        with open(path) as f:
            found[f"{attempt}/{rank}"] = any(k.endswith(f"/{rank}") for k in json.load(f))
    return found


def summarise_attempts(out: str, began: float, steps: int) -> dict:
    """What each worker logged: per attempt (TORCHELASTIC_RESTART_COUNT) and rank, the steps
    it ran; which ranks were restarted (a new process); how many steps ran twice."""
    runs = []
    for path in sorted(glob.glob(os.path.join(out, "steps-*.jsonl"))):
        with open(path) as f:
            runs += [json.loads(line) for line in f]
    attempts = sorted({r["attempt"] for r in runs})
    pid = {(r["attempt"], r["rank"]): r["pid"] for r in runs}
    rank0 = [r["step"] for r in runs if r["rank"] == 0]
    return {"attempts": attempts,
            "steps": {f"{a}/{rank}": sorted(r["step"] for r in runs if (r["attempt"], r["rank"]) == (a, rank))
                      for a in attempts for rank in (0, 1)},
            "restarted_ranks": [rank for rank in (0, 1) if (0, rank) in pid and (1, rank) in pid
                                and pid[0, rank] != pid[1, rank]],
            "repeated": len(rank0) - len(set(rank0)), "completed": set(rank0) == set(range(steps)),
            "stale_keys": stale_keys(out),
            "spans": [(r["attempt"], r["rank"], r["step"], r["began"] - began, r["ended"] - began)
                      for r in runs]}
