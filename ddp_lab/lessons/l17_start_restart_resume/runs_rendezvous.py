"""Scenario 2: an address that is never reached. Every rank calls init_process_group as a script
does (env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment), with MASTER_ADDR
pointing where no store listens, or the right one. Every function here runs on a rank."""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ...launching.rankinfo import rank_info
from ...launching.rankinfo import environ

# TEST-NET-1 (RFC 5737): reserved for documentation, routed nowhere. Any address where no store
# listens does the same: a typo, the wrong node, a node whose job has not started.
UNREACHABLE = "192.0.2.1"


def join(master_addr: str | None = None, timeout_s: float = 1.0, absent_rank: int | None = None) -> dict:
    """init_process_group with `master_addr` as MASTER_ADDR (None: the launcher's, the right one)
    and a `timeout_s` timeout; then one all_reduce. Rank `absent_rank` never calls it (a node
    that never started)."""
    info = rank_info()
    if info.rank == absent_rank:
        return {"joined": False}
    began = time.monotonic()
    try:
        with environ({"MASTER_ADDR": master_addr} if master_addr else {}):
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    finally:
        print(f"init_process_group ended after {time.monotonic() - began:.3f} s")
    try:
        ones = torch.ones(1)
        dist.all_reduce(ones)
        return {"joined": True, "sum": ones.item()}
    finally:
        dist.destroy_process_group()
