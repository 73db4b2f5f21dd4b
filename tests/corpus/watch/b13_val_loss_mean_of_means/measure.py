"""Run broken.py and fixed.py on 2 ranks; from the final model, recompute the validation loss
here over all 48 validation samples and compare with the last value rank 0 printed."""
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
from broken import VAL_FILE_SIZES, make_file  # noqa: E402  (data only)

files = [make_file(10 + k, n, 0.2 + 0.8 * k) for k, n in enumerate(VAL_FILE_SIZES)]
tmp = tempfile.mkdtemp()
try:
    for script in ("broken.py", "fixed.py"):
        out = os.path.join(tmp, script)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE,
                           env={**os.environ, "RUN_STATE_OUT": out, "TMPDIR": tmp}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        printed = float(re.findall(r"val loss ([0-9.]+)", p.stdout)[-1])
        s = [torch.load(f"{out}.rank{r}.pt") for r in range(2)]
        same = all(torch.equal(s[0][k], s[1][k]) for k in s[0])
        model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
        model.load_state_dict(s[0])
        with torch.no_grad():
            sq = [nn.functional.mse_loss(model(x), y, reduction="none").flatten() for x, y in files]
        true = torch.cat(sq).mean().item()
        rank_means = [torch.cat(sq[r::2]).mean().item() for r in range(2)]
        print(f"{script}: printed {printed:.6f}; true mean over 48 samples {true:.6f} "
              f"(error {printed - true:+.6f}); mean of the 2 rank means {sum(rank_means) / 2:.6f} "
              f"(rank shards 38 and 10 samples); ranks' params identical: {same}")
finally:
    shutil.rmtree(tmp)
