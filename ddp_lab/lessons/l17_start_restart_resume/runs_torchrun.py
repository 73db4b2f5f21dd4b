"""The worker torchrun starts in scenarios 1, 3 and 4, run by its path:
`torchrun ... .../runs_torchrun.py MODE --out DIR ...`. Each worker is one rank of torchrun's job;
it writes what it saw into DIR, which the launched rank that ran torchrun's agent reads back
(runs_agents.py).

It runs as a script, not with `-m`, and imports only the standard library at the top: a worker
pays for its own imports at every (re)start, and `-m` would import this lesson's package (torch,
DDP, numpy). Only the training worker of scenario 4 imports torch.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

AGENT_PID = "DDP_LAB_L17_AGENT_PID"  # set by the launched rank that runs torchrun's agent


def env_int(name: str) -> int:
    return int(os.environ[name])


# -- scenario 1: a second job ------------------------------------------------------------------

def second_job(args) -> None:
    """Job B's worker: it reports the port its job's store is on."""
    _write(args.out, "second-job.json", {"master_port": env_int("MASTER_PORT")})


# -- scenario 3: ranks counted per node --------------------------------------------------------

def shard_and_device(by_local_rank: bool) -> tuple[int, int]:
    """(the data shard this rank trains on, the GPU index it takes). Broken: the shard from
    LOCAL_RANK, the GPU from RANK. Fixed: the shard from RANK (one per rank in the world), the
    GPU from LOCAL_RANK (one per rank on this node)."""
    rank, local_rank = env_int("RANK"), env_int("LOCAL_RANK")
    return (local_rank, rank) if by_local_rank else (rank, local_rank)


def shards(args) -> None:
    """What this worker's code picks, with what torchrun told it."""
    shard, gpu = shard_and_device(args.by_local_rank)
    _write(args.out, f"worker-{env_int('RANK')}.json",
           {"rank": env_int("RANK"), "local_rank": env_int("LOCAL_RANK"),
            "node": env_int("GROUP_RANK"), "world_size": env_int("WORLD_SIZE"),
            "gpus_per_node": env_int("LOCAL_WORLD_SIZE"), "shard": shard, "gpu": gpu})


# -- scenario 4: an elastic restart ------------------------------------------------------------

def elastic(args) -> None:
    """`args.steps` steps of a small model over a gloo group; a checkpoint every `args.every`
    steps (rank 0, written whole); on the first attempt rank 1 is killed at step `args.die_at`.
    With `args.resume`, a restarted worker starts from the latest checkpoint; without, from 0."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    attempt, rank = env_int("TORCHELASTIC_RESTART_COUNT"), env_int("RANK")
    _write(args.out, f"stale-{attempt}-{rank}.json", _stale_keys(dist))
    # short: a worker whose peer is gone gives up soon, even if nobody stops it
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start, ckpt = 0, os.path.join(args.out, "checkpoint.pt")
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    for step in range(start, args.steps):
        if attempt == 0 and rank == 1 and step == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a failing GPU would
        began = time.time()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        _log(args.out, attempt, rank, step, began)
        if (step + 1) % args.every == 0:
            if rank == 0:  # written whole: a temporary file, renamed (scenario 6)
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": step + 1}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()
    dist.destroy_process_group()


def _stale_keys(dist) -> list[str]:
    """The process group's keys already in the store torchrun's agent hosts, before this worker
    joins: a store shared across restarts still holds the previous attempt's addresses."""
    from datetime import timedelta

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return []  # rank 0 of the workers hosts a new store for this attempt
    store = dist.TCPStore(os.environ["MASTER_ADDR"], env_int("MASTER_PORT"), is_master=False,
                          timeout=timedelta(seconds=10))
    return sorted(k for k in store.list_keys() if k.startswith("default_pg/"))


def _log(out: str, attempt: int, rank: int, step: int, began: float) -> None:
    with open(os.path.join(out, f"steps-{attempt}-{rank}.jsonl"), "a") as f:
        f.write(json.dumps({"attempt": attempt, "rank": rank, "pid": os.getpid(), "step": step,
                            "began": began, "ended": time.time()}) + "\n")


# -- the worker's entry point ------------------------------------------------------------------

def _write(out: str, name: str, obj) -> None:
    with open(os.path.join(out, name + ".tmp"), "w") as f:
        json.dump(obj, f)
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this worker when the agent that started it dies (as
    ddp_lab.launching.child.die_with_parent, inlined: this script imports only the standard library)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.environ.get(AGENT_PID) and os.getppid() != int(os.environ[AGENT_PID]):
        raise SystemExit("torchrun's agent is already gone")  # it died before prctl took effect
    # SIGTERM ends a worker at once, as in a fresh interpreter: a fork of the agent (--run-path)
    # inherits the agent's Python handler, which cannot run while gloo waits in C++
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


MODES = {"second_job": second_job, "shards": shards, "elastic": elastic}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(MODES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--by-local-rank", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--die-at", type=int, default=5)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pg-timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    if args.mode == "elastic":  # @record: torchrun's summary then shows the worker's traceback
        from torch.distributed.elastic.multiprocessing.errors import record

        record(MODES[args.mode])(args)
    else:
        MODES[args.mode](args)


if __name__ == "__main__":
    _die_with_parent()  # torchrun's agent runs in a launched rank: go when it goes
    main()
