"""Run broken.py and fixed.py on 2 ranks; compare the samples the two ranks trained on."""
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
        x0 = torch.load(os.path.join(out, "rank0.pt"))
        x1 = torch.load(os.path.join(out, "rank1.pt"))
    finally:
        shutil.rmtree(out)
    same = int((x0 == x1).all(dim=1).sum())
    distinct = len({tuple(r.tolist()) for r in torch.cat([x0, x1])})
    print(f"{script}: {same}/{len(x0)} draws identical on rank 0 and rank 1 at the same position; "
          f"{distinct} distinct samples among the {2 * len(x0)} trained on")
    return same, len(x0)


if __name__ == "__main__":
    b, n = run("broken.py")
    f, _ = run("fixed.py")
    print("BUG SHOWN" if b == n and f < n // 4 else "NOT SHOWN")
