"""Run broken.py and fixed.py on 2 ranks, then compare each rank's final parameters with a
single-process run on the same global batches (same init), once at lr and once at world_size * lr."""
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broken import SineStream  # noqa: E402  (data only)


def single_process(lr_scale):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 24), nn.Tanh(), nn.Linear(24, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02 * lr_scale, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    shards = [list(SineStream(160, r, 2)) for r in range(2)]
    for b in range(0, 80, 8):
        losses = []
        for shard in shards:
            x = torch.stack([s[0] for s in shard[b:b + 8]])
            y = torch.stack([s[1] for s in shard[b:b + 8]])
            losses.append(nn.functional.mse_loss(model(x), y))
        opt.zero_grad()
        (sum(losses) / 2).backward()  # DDP's averaged gradient
        opt.step()
        sched.step()
    return model.state_dict()


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


ref_1x, ref_2x = single_process(1), single_process(2)
tmp = tempfile.mkdtemp()
try:
    for script in ("broken.py", "fixed.py"):
        out = os.path.join(tmp, script)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE,
                           env={**os.environ, "RUN_STATE_OUT": out, "TMPDIR": tmp}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        s = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
        print(f"{script}: rank0 vs rank1 {maxdiff(s[0], s[1]):.2e}; vs single-process at lr "
              f"{maxdiff(s[0], ref_1x):.2e}; vs single-process at 2*lr {maxdiff(s[0], ref_2x):.2e}")
finally:
    shutil.rmtree(tmp)
