"""Compare the final encoder of 2-rank runs with a 1-process run on the same global batch.

With nproc=1 each step sees the whole global batch of 32 (the per-rank batch is 32 // world and the
DistributedSampler's permutation is the same), so fixed.py on 1 process is the reference."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script, nproc):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_EXPORT_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script],
                           cwd=HERE, env=env, check=True, timeout=120, capture_output=True, text=True)
        last = [l for l in p.stdout.splitlines() if "loss" in l][-1]
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc)], last
    finally:
        shutil.rmtree(out)


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main():
    ref, ref_last = run("fixed.py", 1)
    print(f"reference fixed.py nproc=1: last '{ref_last}'")
    for script, nproc in [("fixed.py", 2), ("broken.py", 2), ("broken.py", 1)]:
        sds, last = run(script, nproc)
        across = max(maxdiff(sds[0], s) for s in sds)
        print(f"{script} nproc={nproc}: max |param - reference| = {maxdiff(sds[0], ref[0]):.3e}; "
              f"across ranks = {across:.1e}; last '{last}'")


if __name__ == "__main__":
    main()
