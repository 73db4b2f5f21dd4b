"""What the flight recorder costs a warm launch: the same 2-rank launches with recording off
(`TORCH_FR_BUFFER_SIZE=0`) and with torch's default (recording on, 2000 entries) plus ddp_lab's
dump of each rank's record, which every launch makes, interleaved in one run on this machine.

    .venv/bin/python benchmarks/flight_recorder_cost.py [--repeat 15] [--collectives 200]

Two workloads: one all_reduce (the launch itself dominates), and `--collectives` all_reduces of
a [1024] float32 tensor (what recording each collective costs). Prints the median wall time of
each and the ratio on/off; then what one dump of a full ring (2000 entries) costs a rank.
"""
from __future__ import annotations

import argparse
import statistics
import time


def one(n):
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    for _ in range(n):
        dist.all_reduce(t)
    return n


def full_ring_dump(repeat: int = 5):
    """Seconds to dump and parse a full record (2000 collectives), as the launcher's rank does."""
    import os
    import tempfile

    import torch
    import torch.distributed as dist

    from ddp_lab.launching import flight

    for _ in range(2000):
        dist.all_reduce(torch.ones(4))
    times, path = [], os.path.join(tempfile.mkdtemp(), "record")
    for _ in range(repeat):
        t0 = time.perf_counter()
        flight._dump(path)
        with open(path, "rb") as f:
            entries = len(flight.parse(f.read()))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), entries


def main() -> None:
    import ddp_lab

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--collectives", type=int, default=200)
    args = ap.parse_args()
    ddp_lab.prewarm(wait=True)
    settings = {"off": {"TORCH_FR_BUFFER_SIZE": "0"}, "on": {}}
    for n in (1, args.collectives):
        times = {k: [] for k in settings}
        ddp_lab.launch(one, n).raise_for_status()  # warm this workload once
        for _ in range(args.repeat):
            for name, env in settings.items():  # interleaved: both see the same machine load
                t0 = time.perf_counter()
                ddp_lab.launch(one, n, env=env, timeout=60).raise_for_status()
                times[name].append(time.perf_counter() - t0)
        off, on = (statistics.median(times[k]) for k in ("off", "on"))
        print(f"{n:>4} all_reduce(s): recorder off {off:.3f} s, on {on:.3f} s, "
              f"on/off {on / off:.3f} (median of {args.repeat})")
    seconds, entries = ddp_lab.launch(full_ring_dump, timeout=120).raise_for_status().values[0]
    print(f"dump + parse of a full record ({entries} collectives): {seconds * 1000:.1f} ms per rank")


if __name__ == "__main__":
    main()
