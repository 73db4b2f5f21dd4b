"""Scenario 7: every rank prepares the data. A dataset cache (tokenised text, resized images: here
a tensor built from a seed) is built once and read from a file afterwards. Every function here
runs on a rank."""
from __future__ import annotations

import os
import pickle

import torch
import torch.distributed as dist

from ...instruments.probes import gather
from ...launching.rankinfo import rank_info
from .runs import shared_dir

ROUNDS = 30  # the race is timing: each round is a fresh cache file, every rank starting together


def build() -> torch.Tensor:
    """The expensive preparation (here: a few MB of numbers from a fixed seed)."""
    return torch.randn(512, 1024, generator=torch.Generator().manual_seed(0))


def every_rank_prepares(path: str) -> bool:
    """The single-process habit, run by every rank: build the cache if it is not there yet."""
    if not os.path.exists(path):
        torch.save(build(), path)
        return True
    return False


def rank0_prepares(path: str) -> bool:
    """Rank 0 builds (into a temporary name, renamed whole); the others wait at the barrier."""
    built = False
    if rank_info().is_main and not os.path.exists(path):
        torch.save(build(), path + ".tmp")
        os.replace(path + ".tmp", path)
        built = True
    dist.barrier()  # waits up to the process group's timeout: the build must finish within it
    return built


def prepare_and_load(prepare=every_rank_prepares, rounds: int = ROUNDS) -> dict:
    """`rounds` times: every rank meets at a barrier (the job starts), calls `prepare(path)`,
    then loads the cache. Counts the rounds where more than one rank built it, and the loads that
    failed or read something other than the cache (a torn file)."""
    expected = build()
    built, torn, errors = [], [], []
    with shared_dir() as d:
        for r in range(rounds):
            path = os.path.join(d, f"cache-{r}.pt")
            dist.barrier()
            built.append(prepare(path))
            try:
                ok = torch.equal(torch.load(path), expected)
            except (RuntimeError, EOFError, FileNotFoundError, pickle.UnpicklingError) as exc:  # a torn or missing file
                ok = False
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            torn.append(not ok)
        dist.barrier()
    per_rank = gather({"built": built, "torn": torn, "errors": errors})
    builders = [sum(v["built"][r] for v in per_rank) for r in range(rounds)]
    torn_rounds = [any(v["torn"][r] for v in per_rank) for r in range(rounds)]
    return {"rounds": rounds, "builds": sum(builders), "rounds_built_twice": sum(b > 1 for b in builders),
            "torn_loads": sum(sum(v["torn"]) for v in per_rank),
            "raced": sum(b > 1 or t for b, t in zip(builders, torn_rounds)),
            "errors": sorted({e for v in per_rank for e in v["errors"]})}
