"""Run broken.py and fixed.py on 2 ranks; recompute the validation loss of the weights the run kept
as its best and compare it with the best validation loss the run printed."""
import os, re, subprocess, sys, tempfile, shutil
import torch
import torch.nn as nn

TORCHRUN = "/work/main/.venv/bin/torchrun"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broken import make_data  # the same validation data the scripts build


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_OUT=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        state = torch.load(os.path.join(out, "rank0.pt"))
    finally:
        shutil.rmtree(out)
    m = re.search(r"saved best model from epoch (\d+) \(val ([0-9.]+)\)", p.stdout)
    vals = re.findall(r"epoch (\d+) val ([0-9.]+)", p.stdout)
    net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    net.load_state_dict(state)
    xv, yv = make_data(1, 64, shift=0.5)
    with torch.no_grad():
        kept = nn.functional.mse_loss(net(xv), yv).item()
    print(f"{script}: printed best epoch {m.group(1)} val {m.group(2)}; last epoch val {vals[-1][1]}; "
          f"val loss of the kept weights {kept:.4f}")


for script in ("broken.py", "fixed.py"):
    run(script)
