"""Run each script on 2 ranks and on 1 rank; count the optimizer steps rank 0 reports and compare
final parameters. 32 records, 4 per rank per step: 2 ranks should share the records (4 steps)."""
import sys
import os, re, shutil, subprocess, tempfile
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script, nproc):
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, STATE_DUMP_DIR=d, TMPDIR=d)  # torchrun scratch dirs go in d too
        out = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script], cwd=HERE, env=env,
                             check=True, timeout=180, capture_output=True, text=True).stdout
        steps = int(re.search(r"finished after (\d+) steps", out).group(1))
        sds = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(nproc)]
        return steps, [torch.cat([v.flatten() for v in sd.values()]) for sd in sds]
    finally:
        shutil.rmtree(d)


for name in ("broken.py", "fixed.py"):
    s2, p2 = run(name, 2)
    s1, p1 = run(name, 1)
    print(f"{name}: 2 ranks -> {s2} steps x 4 records x 2 ranks = {s2 * 8} record-visits for 32 records; "
          f"1 rank -> {s1} steps; max |params(2 ranks) - params(1 rank)| = {(p2[0] - p1[0]).abs().max().item():.2e}"
          f" (rank0 vs rank1 {(p2[0] - p2[1]).abs().max().item():.1e})")
