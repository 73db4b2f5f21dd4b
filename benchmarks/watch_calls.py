"""What `ddp-lab watch` adds to a training step, counted rather than timed: the Python-level
calls (Python functions and the C functions called from Python, as cProfile counts them) one
step of each script of examples/scripts/ makes alone and under watch's checks. A count moves by
a few calls a step from run to run (within 4 % alone, 1 % under watch, on train_ddp.py), where
a 2-core machine's per-step times move by 10 % (watch_script_cost.py), and it does not depend
on what else the machine runs: it tells a cut of a few per cent from noise, before the timed
benchmark says what the cut buys. It counts calls, not their cost: a call into torch's kernels
and a dict lookup count one each.

Each count runs the script in a process of its own, at world size 1 (gloo; the rank's own
process group, as torchrun would start it), once with S1 and once with S2 steps; the calls per
step are the difference over the steps between (imports and set-up cancel out).

    .venv/bin/python benchmarks/watch_calls.py [--steps 100 300] [script ...]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "examples" / "scripts"
SCRIPTS = {"train_ddp.py": "--epochs", "train_fsdp2.py": "--steps", "train_compiled.py": "--steps"}
BATCHES = 8  # train_ddp.py's batches an epoch at world size 1 (64 samples, batch 8)


def child(mode: str, name: str, steps: int) -> None:
    """In the counting process: run `name` for `steps` steps alone or under watch, under
    cProfile; print {"steps": the script's own count, kind: calls} as the last line."""
    import contextlib
    import cProfile
    import io
    import pstats
    import re
    import runpy
    import tempfile

    import torch

    torch.set_num_threads(1)  # as torchrun sets OMP_NUM_THREADS=1
    path = str(HERE / name)
    flag = SCRIPTS[name]
    args = [flag, str(max(1, steps // BATCHES) if flag == "--epochs" else steps)]
    out, profile = io.StringIO(), cProfile.Profile()
    with contextlib.redirect_stdout(out):
        profile.enable()
        if mode == "alone":
            sys.argv = [path, *args]
            runpy.run_path(path, run_name="__main__")
        else:
            from ddp_lab.doctor.watch.core import script_rank
            with tempfile.TemporaryDirectory(prefix="ddp-lab-calls-") as folder:
                script_rank(path, args, folder, None, path)
        profile.disable()
    done = re.findall(r"^(\d+) steps in", out.getvalue(), re.M)
    counts = {"steps": int(done[-1]) if done else 0}
    for (filename, _, _), (_, calls, _, _, _) in pstats.Stats(profile).stats.items():
        kind = ("watch" if f"{os.sep}ddp_lab{os.sep}" in filename else
                "torch" if f"{os.sep}torch{os.sep}" in filename else
                "C" if filename == "~" else "other")
        counts[kind] = counts.get(kind, 0) + calls
    print(json.dumps(counts))


def count(mode: str, name: str, steps: int) -> dict:
    with socket.socket() as s:  # a free port for the rank's own rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, __file__, "--child", mode, name, str(steps)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"{mode} {name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def per_step(mode: str, name: str, low: int, high: int) -> dict:
    a, b = count(mode, name, low), count(mode, name, high)
    steps = b["steps"] - a["steps"]
    if steps <= 0:
        raise RuntimeError(f"{name} printed no step count ({a}, {b})")
    return {k: (b.get(k, 0) - a.get(k, 0)) / steps for k in set(a) | set(b) if k != "steps"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=[100, 300], metavar=("S1", "S2"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    unknown = [s for s in args.scripts if s not in SCRIPTS]
    if unknown or not 0 < args.steps[0] < args.steps[1]:
        parser.error(f"scripts are {', '.join(SCRIPTS)}; --steps S1 S2 with 0 < S1 < S2"
                     if unknown else "--steps S1 S2 needs 0 < S1 < S2")
    print("| script | calls a step alone | under watch | watch ÷ alone | watch's own functions |"
          "\n|---|---|---|---|---|")
    for name in args.scripts:
        alone, watched = per_step("alone", name, *args.steps), per_step("watch", name, *args.steps)
        a, w = sum(alone.values()), sum(watched.values())
        print(f"| {name} | {a:.0f} | {w:.0f} | {w / a:.2f} | {watched.get('watch', 0):.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
