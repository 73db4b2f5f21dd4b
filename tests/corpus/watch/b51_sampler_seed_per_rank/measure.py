"""Run broken.py and fixed.py on 2 ranks; check that each epoch the two ranks' samples partition the dataset."""
import os, subprocess, tempfile, shutil
import torch

TORCHRUN = "/work/main/.venv/bin/torchrun"
HERE = os.path.dirname(os.path.abspath(__file__))
N = 40


def run(script):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_OUT=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        o0 = torch.load(os.path.join(out, "rank0.pt"))
        o1 = torch.load(os.path.join(out, "rank1.pt"))
    finally:
        shutil.rmtree(out)
    for e in sorted(o0):
        a, b = set(o0[e]), set(o1[e])
        print(f"  {script} epoch {e}: samples seen by both ranks {len(a & b)}, never seen {N - len(a | b)} of {N}")


for script in ("broken.py", "fixed.py"):
    run(script)
