"""Run broken.py and fixed.py on 2 CPU ranks and compare their final parameters with a single-process
replay of the same 8 steps that skips a step when either shard's loss is out of range."""
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
spec = importlib.util.spec_from_file_location("case", os.path.join(HERE, "fixed.py"))
case = importlib.util.module_from_spec(spec)
spec.loader.exec_module(case)


def run(script):
    out = tempfile.mkdtemp()
    try:
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE,
                           env=dict(os.environ, RUN_STATE_DIR=out, TMPDIR=out), capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    finally:
        shutil.rmtree(out)


def reference():
    x, y = case.make_data()
    half = case.N_RECORDS // 2
    shards = [(x[:half], y[:half]), (x[half:], y[half:])]
    model = case.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    worst = {}
    for step in range(half // case.BATCH):
        sl = slice(step * case.BATCH, (step + 1) * case.BATCH)
        losses = [nn.functional.mse_loss(model(sx[sl]), sy[sl]) for sx, sy in shards]
        if any(not math.isfinite(l.item()) or l.item() >= case.MAX_LOSS for l in losses):
            worst[step] = [round(l.item(), 1) for l in losses]
            continue
        opt.zero_grad()
        (sum(losses) / 2).backward()
        opt.step()
    return model.state_dict(), worst


ref, skipped = reference()
print(f"reference skips steps {sorted(skipped)} (shard losses rank0/rank1: {skipped})")
for script in ("broken.py", "fixed.py"):
    s0, s1 = run(script)
    ranks = max((s0[k] - s1[k]).abs().max().item() for k in s0)
    off = max((s0[k] - ref[k]).abs().max().item() for k in s0)
    norm = torch.cat([v.flatten() for v in s0.values()]).norm().item()
    print(f"{script}: max |rank0 - rank1| {ranks:.3e}  max |rank0 - reference| {off:.3e}  param norm {norm:.4g}"
          f" (reference {torch.cat([v.flatten() for v in ref.values()]).norm().item():.4g})")
