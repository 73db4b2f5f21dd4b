"""Run broken.py and fixed.py under torchrun (2 CPU ranks), have each rank dump its final
parameters, and report how far rank 1's model is from rank 0's (the checkpoint is rank 0's).
Usage: python measure.py"""
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    out = tempfile.mkdtemp(prefix="b43_")
    try:
        env = dict(os.environ, TRAIN_STATS_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
        if p.returncode != 0:
            sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    for script in ("broken.py", "fixed.py"):
        s0, s1 = run(script)
        diffs = {k: (s0[k] - s1[k]).abs().max().item() for k in s0}
        worst = max(diffs, key=diffs.get)
        n_diff = sum(d > 0 for d in diffs.values())
        print(f"{script}: {n_diff}/{len(diffs)} tensors differ between rank 0 and rank 1; "
              f"max |diff| {diffs[worst]:.3g} ({worst})")


if __name__ == "__main__":
    main()
