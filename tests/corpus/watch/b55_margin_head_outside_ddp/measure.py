#!/work/main/.venv/bin/python
"""Run broken.py and fixed.py on 2 ranks, dump each rank's final backbone and loss-head weights, compare ranks."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script):
    out = tempfile.mkdtemp()
    env = dict(os.environ, STATE_DUMP_DIR=out)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE, env=env,
                       timeout=120, capture_output=True)
    assert p.returncode == 0, p.stderr[-2000:]
    states = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    shutil.rmtree(out)
    return states


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


for name in ("broken", "fixed"):
    s = run(name + ".py")
    heads = [{k.removeprefix("module."): v for k, v in st["criterion"].items()} for st in s]
    print(f"{name}: backbone rank0 vs rank1 max diff {maxdiff(s[0]['model'], s[1]['model']):.2e}; "
          f"loss head W rank0 vs rank1 max diff {maxdiff(heads[0], heads[1]):.2e}")
