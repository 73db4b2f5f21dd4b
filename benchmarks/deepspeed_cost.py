"""What DeepSpeed costs a rank: `import deepspeed` in a rank forked from the warm fork server
(torch already imported), and `deepspeed.initialize` with ZeRO-3 on a small MLP, on 2 ranks.
Run: .venv/bin/python benchmarks/deepspeed_cost.py [--repeat 3]"""
from __future__ import annotations

import argparse
import statistics
import time

import ddp_lab


def rank_cost() -> dict:
    start = time.perf_counter()
    import deepspeed  # noqa: F401

    imported = time.perf_counter() - start
    from ddp_lab.lessons.l12_sharded_modules import mlp, zero3_engine

    start = time.perf_counter()
    zero3_engine(mlp())
    return {"import_s": imported, "initialize_s": time.perf_counter() - start}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    ddp_lab.prewarm(wait=True)
    runs = [ddp_lab.launch(rank_cost, world_size=2, timeout=300) for _ in range(args.repeat)]
    for key in ("import_s", "initialize_s"):
        values = [r.value[key] for run in runs for r in run.ranks]
        print(f"{key}: median {statistics.median(values):.2f} s, "
              f"range {min(values):.2f}-{max(values):.2f} s over {len(values)} rank-runs")


if __name__ == "__main__":
    main()
