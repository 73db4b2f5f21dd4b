"""What a rank's first torch.compile costs (lesson 15): the first compiled DDP step of a small
module (`warmup_net_fixed`, backend aot_eager), per rank, with the fork server preloading what a
first compile imports (`l15.COMPILER_MODULES`, what `prepare()` does) and without, each in a
fresh session, interleaved.

    .venv/bin/python benchmarks/compile_cost.py [--repeat 3] [--inductor]

`--inductor` also times inductor once in this process on the same module, from an empty cache
directory (gcc builds its kernels) and again from the warm cache, beside the eager step.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time


def first_step() -> float:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.instruments.compilewatch import CompileWatch
    from ddp_lab.lessons.l15_compile import features, warmup_net_fixed

    with CompileWatch() as watch:
        model = torch.compile(DDP(warmup_net_fixed()), backend=watch.backend)
        start = time.perf_counter()
        model(features(0)).sum().backward()
        return time.perf_counter() - start


def session(preload: bool, repeat: int) -> None:
    import ddp_lab
    from ddp_lab.launching import processes as _procs
    from ddp_lab.lessons import l15_compile as l15

    _procs.prewarm(wait=True, modules=list(l15.COMPILER_MODULES) if preload else [])
    for _ in range(repeat):
        result = ddp_lab.launch(first_step, timeout=300).raise_for_status()
        print(f"{'preloaded' if preload else 'cold     '}: first step per rank "
              + ", ".join(f"{v:.2f} s" for v in result.values), flush=True)


def inductor() -> None:
    import os
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
    import torch

    from ddp_lab.lessons.l15_compile import features, warmup_net_fixed

    def steps(model, n=20) -> float:
        start = time.perf_counter()
        for _ in range(n):
            model(features(0)).sum().backward()
        return (time.perf_counter() - start) / n

    for cache in ("empty", "warm"):
        torch.compiler.reset()
        model = torch.compile(warmup_net_fixed(), backend="inductor")
        start = time.perf_counter()
        model(features(0)).sum().backward()
        print(f"inductor, {cache} cache: first step {time.perf_counter() - start:.2f} s, "
              f"then {steps(model) * 1e3:.2f} ms a step")
    print(f"eager: {steps(warmup_net_fixed()) * 1e3:.2f} ms a step")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--session", choices=("cold", "preloaded"))
    args = ap.parse_args()
    if args.session:
        return session(args.session == "preloaded", args.repeat)
    for which in ("cold", "preloaded", "cold", "preloaded"):
        subprocess.run([sys.executable, __file__, "--session", which, "--repeat",
                        str(args.repeat)], check=True)
    if args.inductor:
        inductor()


if __name__ == "__main__":
    main()
