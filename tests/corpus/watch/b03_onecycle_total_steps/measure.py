"""Run broken.py and fixed.py on 2 CPU ranks (batch 8 each) and compare the learning rates and final
parameters with a single-process run on the same global batch (fixed.py, 1 process, batch 16)."""
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
        lrs = [float(v) for v in re.findall(r" lr ([0-9.e+-]+)", p.stdout)]
        return lrs, [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc)]
    finally:
        shutil.rmtree(out)


ref_lrs, (ref,) = run("fixed.py", 1, "--batch-size", "16")
print(f"single process, global batch 16: {len(ref_lrs)} steps, peak lr {max(ref_lrs):.3e}, last lr {ref_lrs[-1]:.3e}")
for script in ("broken.py", "fixed.py"):
    lrs, (s0, s1) = run(script, 2)
    ranks = max((s0[k] - s1[k]).abs().max().item() for k in s0)
    off = max((s0[k] - ref[k]).abs().max().item() for k in s0)
    lr_off = max(abs(a - b) for a, b in zip(lrs, ref_lrs))
    print(f"{script}: {len(lrs)} steps, peak lr at step {lrs.index(max(lrs))}, last lr {lrs[-1]:.3e}, "
          f"max |lr - single| {lr_off:.3e}; max |rank0 - rank1| {ranks:.1e}; max |param - single| {off:.3e}")
