"""What `ddp_lab.watch` costs a training step: the same step of examples/watch_train.py
(train_step_fixed, a 2-layer MLP with dropout, 2 ranks, DDP, gloo on the CPU) timed in a bare
loop and under watch, in one run on this machine.

    .venv/bin/python benchmarks/watch_cost.py [--steps 30] [--repeat 3]

Prints the median seconds per step of each (the first step left out) and the difference: what
watch's instruments (its TorchFunctionMode, dropout hooks) and its checks after each step (a
hash per tensor, the records) add.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "watch_train.py"


def bare(step_fn, factory, batches, steps: int) -> list[float]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab import rank_info

    rank = rank_info().rank
    model = DDP(factory())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        step_fn(model, batches(rank, step), step, optimizer=opt)
        times.append(time.perf_counter() - start)
    return times[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    import ddp_lab
    from ddp_lab.doctor.loader import load_file

    ex = load_file(str(EXAMPLE))
    plain, watched = [], []
    for _ in range(args.repeat):
        run = ddp_lab.launch(bare, ex.train_step_fixed, ex.seeded_net, ex.batches, args.steps)
        plain += [t for r in run.ranks for t in r.value]
        report = ddp_lab.watch(ex.train_step_fixed, ex.seeded_net, ex.batches, steps=args.steps)
        assert report.ok, report.text()
        watched += [s + c for r in report.run.ranks for s, c in r.value["seconds"][1:]]
    a, b = statistics.median(plain), statistics.median(watched)
    print(f"bare step: {a * 1e3:.2f} ms; under watch: {b * 1e3:.2f} ms; "
          f"watch adds {(b - a) * 1e3:.2f} ms per step ({args.steps} steps x {args.repeat}, 2 ranks)")


if __name__ == "__main__":
    main()
