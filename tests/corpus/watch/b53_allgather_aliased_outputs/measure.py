"""Run broken.py and fixed.py on 2 ranks; recompute the validation accuracy of the trained model on the
whole 48-sample validation set in one process and compare it with the accuracy rank 0 printed."""
import os, re, subprocess, sys, tempfile, shutil
import torch
import torch.nn as nn

TORCHRUN = "/work/main/.venv/bin/torchrun"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broken import make_blobs  # the same validation data the scripts build


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
    printed = float(re.search(r"val acc ([0-9.]+)", p.stdout).group(1))
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    net.load_state_dict(state)
    x, y = make_blobs(1, 48).tensors
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        pred = net(x).float().argmax(dim=1)
    true_acc = (pred == y).float().mean().item()
    half = (pred[1::2] == y[1::2]).float().mean().item()
    print(f"{script}: printed val acc {printed:.4f}; accuracy on all 48 samples {true_acc:.4f}; "
          f"on rank 1's 24 samples alone {half:.4f}")


for script in ("broken.py", "fixed.py"):
    run(script)
