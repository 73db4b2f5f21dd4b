"""Run broken.py and fixed.py on 2 ranks; compare the two ranks' final parameters."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, TRAIN_DUMP_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        s0 = torch.load(os.path.join(out, "rank0.pt"))
        s1 = torch.load(os.path.join(out, "rank1.pt"))
    finally:
        shutil.rmtree(out)
    diffs = {k: (s0[k] - s1[k]).abs().max().item() for k in s0}
    worst = max(diffs, key=diffs.get)
    print(f"{script}: max |rank0 - rank1| = {diffs[worst]:.3e} ({worst}); "
          f"params differing: {sum(v > 0 for v in diffs.values())}/{len(diffs)}")
    return diffs[worst]


if __name__ == "__main__":
    b = run("broken.py")
    f = run("fixed.py")
    print("BUG SHOWN" if b > 1e-4 and f == 0.0 else "NOT SHOWN")
