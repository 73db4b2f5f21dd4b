"""Reference: fixed.py on 1 rank, i.e. InfoNCE over the whole global batch of 16 pairs (15 negatives
per anchor). Run broken.py and fixed.py on 2 ranks (8 pairs each) and compare final parameters."""
import sys
import os, shutil, subprocess, tempfile
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script, nproc):
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, STATE_DUMP_DIR=d, TMPDIR=d)  # torchrun scratch dirs go in d too
        subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script], cwd=HERE, env=env,
                       check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sds = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(nproc)]
        return [torch.cat([v.flatten() for v in sd.values()]) for sd in sds]
    finally:
        shutil.rmtree(d)


ref = run("fixed.py", 1)[0]
for name in ("broken.py", "fixed.py"):
    p = run(name, 2)
    print(f"{name} on 2 ranks: max |param - global-batch reference| = {(p[0] - ref).abs().max().item():.2e}, "
          f"rel L2 {((p[0] - ref).norm() / ref.norm()).item():.2e}; rank0 vs rank1 {(p[0] - p[1]).abs().max().item():.1e}")
