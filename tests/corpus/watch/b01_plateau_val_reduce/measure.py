"""Run broken.py and fixed.py on 2 CPU ranks; compare each rank's final learning rate and parameters."""
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_STATE_DIR=out, TMPDIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE, env=env,
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    finally:
        shutil.rmtree(out)


for script in ("broken.py", "fixed.py"):
    s0, s1 = run(script)
    diff = max((s0["model"][k] - s1["model"][k]).abs().max().item() for k in s0["model"])
    print(f"{script}: rank0 lr {s0['lr']:.4g}  rank1 lr {s1['lr']:.4g}  max |param rank0 - rank1| {diff:.3e}")
