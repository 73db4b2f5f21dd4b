"""Scenario 1: who writes the checkpoint. Runs on a rank."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import gather
from ...launching.rankinfo import device, rank_info
from .runs import checksum, count_saves, fingerprint, shared_tmpdir, train


def save_on_every_rank(model: DDP, path: str) -> None:
    """The single-process habit: every rank runs the same line, so every rank writes the file."""
    torch.save(model.module.state_dict(), path)


def save_on_rank0(model: DDP, path: str) -> None:
    """The fix: rank 0 writes; the others wait at the barrier that follows."""
    if rank_info().is_main:
        torch.save(model.module.state_dict(), path)


def checkpoint_and_reload(save=save_on_every_rank, ckpt_dir: str | None = None, steps: int = 3) -> dict:
    """Train, `save(model, path)`, wait at a barrier until every writer is done, then every rank
    loads the file. Measures which ranks wrote, and whose state the file holds."""
    dev = device()
    model = train(dev, steps)
    mine = fingerprint(model.module.state_dict())  # this rank's state when it saves
    entries = gather({k: fingerprint({k: v}) for k, v in model.module.state_dict().items()})
    differs = [k for k in entries[0] if len({e[k] for e in entries}) > 1]
    with shared_tmpdir(ckpt_dir) as d:
        path = os.path.join(d, "checkpoint.pt")
        with count_saves() as saves:
            save(model, path)
        dist.barrier()
        state = torch.load(path, map_location=dev)
        model.module.load_state_dict(state)
    return {**_who_holds_what(mine, fingerprint(state), saves[0] > 0, checksum(state)),
            "differs_between_ranks": differs}


def _who_holds_what(saved: str, loaded: str, wrote: bool, loaded_sum: float) -> dict:
    ranks = gather({"saved": saved, "loaded": loaded, "wrote": wrote})
    writers = [r for r, v in enumerate(ranks) if v["wrote"]]
    in_file = ranks[0]["loaded"]  # after the barrier every rank reads the same bytes
    owners = [r for r, v in enumerate(ranks) if v["saved"] == loaded]
    return {"writers": writers, "distinct_states_written": len({ranks[r]["saved"] for r in writers}),
            "overwritten": sum(ranks[r]["saved"] != in_file for r in writers),
            "is_checkpoint": loaded == ranks[0]["saved"], "checksum": loaded_sum,
            "holds": f"rank {owners[0]}'s state" if owners else "a mix of states"}


def all_load_rank0(result) -> list[str]:
    return [f"rank {r.rank} did not load rank 0's state" for r in result.ranks
            if r.ok and not r.value["is_checkpoint"]]
