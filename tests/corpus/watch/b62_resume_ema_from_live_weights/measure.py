"""Run broken.py and fixed.py on 2 ranks; compare the EMA (and live) weights the run checkpointed
with the ones the resumed Trainer continues from, and the EMA val loss at the last step."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, TRAIN_DUMP_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        saved = torch.load(os.path.join(out, "saved_rank0.pt"))
        resumed = torch.load(os.path.join(out, "resumed_rank0.pt"))
    finally:
        shutil.rmtree(out)
    ema_gap = maxdiff(saved["ema"], resumed["ema"])
    model_gap = maxdiff(saved["model"], resumed["model"])
    ema_vs_live = maxdiff(saved["ema"], saved["model"])
    last = [l for l in p.stdout.splitlines() if l.startswith("step 10 ")][0]
    print(f"{script}: saved vs resumed EMA max diff {ema_gap:.3e}; saved vs resumed model {model_gap:.1e}; "
          f"(saved EMA vs live weights {ema_vs_live:.3e}); last line: {last}")
    return ema_gap, model_gap


if __name__ == "__main__":
    b_ema, b_model = run("broken.py")
    f_ema, f_model = run("fixed.py")
    ok = b_ema > 1e-3 and f_ema == 0.0 and b_model == 0.0 and f_model == 0.0
    print("BUG SHOWN" if ok else "NOT SHOWN")
