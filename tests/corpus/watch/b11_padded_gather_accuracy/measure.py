"""Run broken.py and fixed.py on 2 ranks; recompute the validation accuracy of the trained
model here, on the 21 validation samples, and compare it with what rank 0 printed."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broken import make_data  # noqa: E402  (data only)

x_val = torch.cat([make_data(100 + k, n)[0] for k, n in enumerate([9, 6, 6])])
y_val = torch.cat([make_data(100 + k, n)[1] for k, n in enumerate([9, 6, 6])])

tmp = tempfile.mkdtemp()
try:
    for script in ("broken.py", "fixed.py"):
        out = os.path.join(tmp, script)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE,
                           env={**os.environ, "RUN_STATE_OUT": out, "TMPDIR": tmp}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        acc, c, n = re.search(r"val accuracy ([0-9.]+) \((\d+)/(\d+)\)", p.stdout).groups()
        states = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
        same = all(torch.equal(states[0][k], states[1][k]) for k in states[0])
        model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3))
        model.load_state_dict(states[0])
        with torch.no_grad():
            true_correct = (model(x_val).argmax(1) == y_val).sum().item()
        print(f"{script}: printed accuracy {acc} ({c}/{n}); recomputed {true_correct / len(y_val):.4f} "
              f"({true_correct}/{len(y_val)}); error {float(acc) - true_correct / len(y_val):+.4f}; "
              f"ranks' params identical: {same}")
finally:
    shutil.rmtree(tmp)
