"""What `ddp-lab watch` costs a training script: each script of examples/scripts/ (DDP, FSDP2,
compiled; 2 ranks, gloo on the CPU) run unchanged under `torchrun --nproc-per-node 2` and under
watch's script mode, alternately, in one run on this machine. Each script prints the seconds its
own loop took from its second step on (rank 0); the ratio is watch's per-step time over
torchrun's (medians over the repeats); beside it, the range of the ratios of each watch run to
the torchrun run just before it: how far one pair moves on this machine.

    .venv/bin/python benchmarks/watch_script_cost.py [--repeat 3] [--steps 200]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "examples" / "scripts"
SCRIPTS = {"train_ddp.py": ["--epochs"], "train_fsdp2.py": ["--steps"], "train_compiled.py": ["--steps"]}
TIMED = re.compile(r"^(\d+) steps in ([\d.]+) s$", re.M)


def per_step(text: str) -> float:
    found = TIMED.findall(text)
    if not found:
        raise RuntimeError(f"the script printed no timing:\n{text[-2000:]}")
    steps, seconds = found[-1]
    return float(seconds) / int(steps)


def args_for(name: str, steps: int) -> list[str]:
    flag = SCRIPTS[name][0]
    return [flag, str(max(2, steps // 4) if flag == "--epochs" else steps)]  # 4 batches an epoch


def under_torchrun(name: str, steps: int) -> float:
    # torchrun's agent leaves its log folder (torchelastic_*) and its workers' error files in
    # the temporary folder: a folder of the run's own, removed after it
    with tempfile.TemporaryDirectory(prefix="ddp-lab-bench-") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=tmp)  # OMP: as torchrun sets it
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                               "2", str(HERE / name), *args_for(name, steps)], capture_output=True,
                              text=True, timeout=600, env=env)
    if done.returncode:  # the rank's own message is at the start, torchrun's summary at the end
        raise RuntimeError(f"torchrun {name} exited {done.returncode}:\n{done.stderr[:3000]}\n...\n"
                           f"{done.stderr[-1500:]}")
    return per_step(done.stdout)


def under_watch(name: str, steps: int) -> float:
    from ddp_lab.doctor.watch.script import watch_script

    report = watch_script(str(HERE / name), args_for(name, steps), timeout=600)
    if report.status != "ok":
        raise RuntimeError(report.text())
    return per_step(report.run.ranks[0].stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    args = parser.parse_args(argv)
    print("| script | torchrun ms/step | watch ms/step | watch ÷ torchrun | each pair's ratio, min-max |"
          "\n|---|---|---|---|---|")
    for name in args.scripts:
        bare, watched = [], []
        for _ in range(args.repeat):  # alternated, so that a load change hits both
            bare.append(under_torchrun(name, args.steps))
            watched.append(under_watch(name, args.steps))
        b, w = statistics.median(bare), statistics.median(watched)
        pairs = [x / y for x, y in zip(watched, bare)]  # a run and the torchrun run just before it
        print(f"| {name} | {b * 1e3:.2f} | {w * 1e3:.2f} | {w / b:.2f} | "
              f"{min(pairs):.2f}-{max(pairs):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
