"""Run broken.py and fixed.py on 2 ranks and compare the two ranks' final learning rate and
parameters, saved by each rank at the end of the run."""
import sys
import os
import shutil
import subprocess
import tempfile

import torch

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
HERE = os.path.dirname(os.path.abspath(__file__))

tmp = tempfile.mkdtemp()
try:
    for script in ("broken.py", "fixed.py"):
        out = os.path.join(tmp, script)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE,
                           env={**os.environ, "RUN_STATE_OUT": out, "TMPDIR": tmp}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        s = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
        diff = max((s[0]["model"][k] - s[1]["model"][k]).abs().max().item() for k in s[0]["model"])
        print(f"{script}: final lr rank0 {s[0]['lr']:.5f} vs rank1 {s[1]['lr']:.5f}; "
              f"max |param rank0 - param rank1| {diff:.3e}")
finally:
    shutil.rmtree(tmp)
