"""How steady lesson 18's threads claim is: `oversubscribed_threads` run again and again, each
rank's slowdown (seconds per step at every core over seconds per step at the fair share, timed in
alternating blocks in one run) and the median over both variants' ranks, which the lesson asserts.

    .venv/bin/python benchmarks/threads_slowdown.py [--repeat 8]

Prints every pair of runs and, at the end, the smallest rank value, the smallest median and how
many rank values fell below 1.5 and below 1.
"""
from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=8, help="pairs of runs (broken, fixed)")
    args = parser.parse_args()

    import torch

    from ddp_lab.course.registry import get_scenario
    from ddp_lab.lessons import l18_what_a_rank_costs as l18

    scenario = get_scenario("18", "oversubscribed_threads")
    ranks, medians = [], []
    for i in range(args.repeat):
        runs = [scenario.assert_declared(v, scenario.run(v)) for v in ("broken", "fixed")]
        values = [r.value["slowdown"] for run in runs for r in run.ranks]
        ranks += values
        medians.append(l18.slowdown(*runs))
        print(f"pair {i + 1}: ranks {' '.join(f'{v:.2f}' for v in values)}; "
              f"median {medians[-1]:.2f}", flush=True)
    print(f"torch {torch.__version__}, {l18.cores()} cores: smallest rank value "
          f"{min(ranks):.2f}, smallest median {min(medians):.2f}; rank values below 1.5: "
          f"{sum(v < 1.5 for v in ranks)} of {len(ranks)}, below 1: {sum(v < 1 for v in ranks)}")


if __name__ == "__main__":
    main()
