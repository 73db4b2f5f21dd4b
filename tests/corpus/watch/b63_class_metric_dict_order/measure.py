"""Run broken.py and fixed.py on 2 ranks; compare the per-class accuracy rank 0 prints with the
per-class accuracy of the same final model on the whole held-out set, computed in one process."""
import importlib.util
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def load(script):
    spec = importlib.util.spec_from_file_location(script[:-3], os.path.join(HERE, script))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, TRAIN_DUMP_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        state = torch.load(os.path.join(out, "model.pt"))
    finally:
        shutil.rmtree(out)
    line = [l for l in p.stdout.splitlines() if l.startswith("val acc ")][0]
    printed = {k: float(v) for k, v in (kv.split("=") for kv in line[len("val acc "):].split())}

    mod = load(script)
    model = mod.make_model()
    model.load_state_dict(state)
    x, y = mod.make_data(48, seed=2).tensors
    with torch.no_grad():
        hits = model(x).argmax(dim=1) == y
    true = {name: hits[y == c].float().mean().item() for c, name in enumerate(mod.CLASSES)}
    err = max(abs(printed[k] - true[k]) for k in true)
    print(f"{script}: printed " + " ".join(f"{k}={printed[k]:.4f}" for k in sorted(printed))
          + " | whole set " + " ".join(f"{k}={true[k]:.4f}" for k in sorted(true))
          + f" | max error {err:.4f}")
    return err


if __name__ == "__main__":
    b = run("broken.py")
    f = run("fixed.py")
    print("BUG SHOWN" if b > 1e-3 and f < 1e-4 else "NOT SHOWN")
