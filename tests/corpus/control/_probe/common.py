"""Helpers shared by the control set's measure.py files (no ddp_lab)."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
PROBE = os.path.join(HERE, "probe.py")


def run(script, args=(), nproc=2, timeout=120, probe=True):
    """Run SCRIPT under torchrun (through the probe unless probe=False).

    Returns dict(rc, seconds, out, ranks=[record per rank or None]).
    """
    out_dir = tempfile.mkdtemp(prefix="probe_")
    env = dict(os.environ, PROBE_OUT=out_dir, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    entry = [PROBE, script] if probe else [script]
    cmd = ["timeout", str(timeout), TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", *entry, *args]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=os.path.dirname(os.path.abspath(script)), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    secs = time.time() - t0
    ranks = []
    for r in range(nproc):
        f = os.path.join(out_dir, f"rank{r}.pt")
        ranks.append(torch.load(f, weights_only=False) if os.path.exists(f) else None)
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"rc": p.returncode, "seconds": secs, "out": p.stdout, "ranks": ranks}


def losses(rec):
    return [s["losses"] for s in rec["steps"]]


def first_last(vals, k=3):
    vals = [v for v in vals if v == v]
    return sum(vals[:k]) / max(1, len(vals[:k])), sum(vals[-k:]) / max(1, len(vals[-k:]))


def max_rank_diff(res):
    a, b = res["ranks"][0]["final_params"], res["ranks"][1]["final_params"]
    if a is None or b is None or a.shape != b.shape:
        return float("nan")
    return float((a - b).abs().max())


def check(cond, msg, failures):
    print(("  ok   " if cond else "  FAIL ") + msg)
    if not cond:
        failures.append(msg)


def finish(failures):
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")
