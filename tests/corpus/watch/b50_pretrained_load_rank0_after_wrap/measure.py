"""Run broken.py and fixed.py on 2 ranks; compare the ranks' final fine-tuned parameters."""
import os, subprocess, sys, tempfile, shutil
import torch

TORCHRUN = "/work/main/.venv/bin/torchrun"
HERE = os.path.dirname(os.path.abspath(__file__))


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_OUT=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        s0 = torch.load(os.path.join(out, "rank0.pt"))
        s1 = torch.load(os.path.join(out, "rank1.pt"))
        return max((s0[k] - s1[k]).abs().max().item() for k in s0)
    finally:
        shutil.rmtree(out)


for script in ("broken.py", "fixed.py"):
    print(f"{script}: max |rank0 - rank1| over final parameters = {run(script):.3e}")
