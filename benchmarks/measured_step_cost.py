"""What `ddp_lab.measured_step()` costs a step: an empty step marked with it, against the same
empty step unmarked, on 2 real ranks (gloo, a process group made, as in a training loop), with
and without DataLoader-like child processes to read.

    .venv/bin/python benchmarks/measured_step_cost.py [--steps 200] [--children 2]

Prints the median microseconds a marked step adds on each rank: what reading /proc (the rank's
RSS and high-water mark, each child's memory), the world group's collective count and the
record cost, without the work of any step.
"""
from __future__ import annotations

import argparse
import statistics
import time


def marked_cost(steps: int, children: int) -> dict:
    import multiprocessing as mp

    import ddp_lab

    sleepers = [mp.get_context("fork").Process(target=time.sleep, args=(120,)) for _ in range(children)]
    for p in sleepers:
        p.start()
    try:
        bare, marked = [], []
        for _ in range(steps):
            start = time.perf_counter()
            with _nothing():
                pass
            bare.append(time.perf_counter() - start)
            start = time.perf_counter()
            with ddp_lab.measured_step():
                pass
            marked.append(time.perf_counter() - start)
        return {"bare_us": statistics.median(bare) * 1e6, "marked_us": statistics.median(marked) * 1e6}
    finally:
        for p in sleepers:
            p.kill()
            p.join()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--children", type=int, default=2, help="child processes each rank holds")
    args = p.parse_args()
    import ddp_lab

    for children in sorted({0, args.children}):
        run = ddp_lab.launch(marked_cost, args.steps, children, world_size=2, timeout=120)
        run.raise_for_status()
        added = [r.value["marked_us"] - r.value["bare_us"] for r in run.ranks]
        print(f"{children} child process(es) per rank: measured_step adds "
              + ", ".join(f"rank {r} {a:.0f} us" for r, a in enumerate(added))
              + f" per step (median of {args.steps}, 2 ranks, gloo)")


if __name__ == "__main__":
    main()
