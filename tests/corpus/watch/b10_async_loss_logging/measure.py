"""Run broken.py and fixed.py on 2 ranks and compare the logged per-step loss with the
global mean loss recomputed here in one process (same init, same DistributedSampler shards)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broken import make_dataset  # noqa: E402  (data only, no process group)


def reference():
    """Per step: (global mean loss, rank 0's own loss / 2), training single-process on the union of both shards."""
    ds = make_dataset()
    x_all, y_all = ds.tensors
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    samplers = [DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0) for r in range(2)]
    out = []
    for epoch in range(2):
        idx = []
        for s in samplers:
            s.set_epoch(epoch)
            idx.append(list(s))
        for b in range(0, len(idx[0]), 8):
            per_rank = [nn.functional.mse_loss(model(x_all[i[b:b + 8]]), y_all[i[b:b + 8]]) for i in idx]
            loss = sum(per_rank) / 2  # DDP's averaged gradient == gradient of the mean of the rank losses
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append((loss.item(), per_rank[0].item() / 2))
    return out


def run(script):
    tmp = tempfile.mkdtemp()  # torchrun's scratch files go here, removed afterwards
    try:
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env={**os.environ, "TMPDIR": tmp}, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    return [float(v) for v in re.findall(r"loss ([0-9.]+)", p.stdout)]


ref = reference()
for script in ("broken.py", "fixed.py"):
    logged = run(script)
    wrong = [i for i, (v, (g, _)) in enumerate(zip(logged, ref)) if abs(v - g) > 1e-4]
    local = [i for i, (v, (_, l)) in enumerate(zip(logged, ref)) if abs(v - l) < 1e-4]
    worst = max(abs(v - g) for v, (g, _) in zip(logged, ref))
    print(f"{script}: {len(logged)} steps logged; {len(wrong)} differ from the global mean "
          f"(max abs diff {worst:.4f}); {len(local)} equal rank 0's own loss / world_size")
    if wrong:
        i = wrong[0]
        print(f"  e.g. step {i}: logged {logged[i]:.6f}, global mean {ref[i][0]:.6f}, rank-0 own/2 {ref[i][1]:.6f}")
