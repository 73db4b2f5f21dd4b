"""Run broken.py and fixed.py on 2 CPU ranks (micro-batch 8, accumulation 2: global batch 32) and
compare the learning rate and final parameters with one process on the same global batch
(fixed.py, 1 process, micro-batch 16)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script, nproc, *args):
    out = tempfile.mkdtemp()
    try:
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), script, *args], cwd=HERE,
                           env=dict(os.environ, RUN_STATE_DIR=out, TMPDIR=out), capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
        lr = float(re.search(r" lr ([0-9.e+-]+)", p.stdout).group(1))
        return lr, [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc)]
    finally:
        shutil.rmtree(out)


ref_lr, (ref,) = run("fixed.py", 1, "--batch-size", "16")
print(f"single process, global batch 32: lr {ref_lr:.4g}")
for script in ("broken.py", "fixed.py"):
    lr, (s0, s1) = run(script, 2)
    ranks = max((s0[k] - s1[k]).abs().max().item() for k in s0)
    off = max((s0[k] - ref[k]).abs().max().item() for k in s0)
    print(f"{script}: lr {lr:.4g}; max |rank0 - rank1| {ranks:.1e}; "
          f"max |param - single| {off:.3e}")
