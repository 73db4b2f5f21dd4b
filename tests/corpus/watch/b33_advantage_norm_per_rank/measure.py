"""Reference: fixed.py on 1 rank, i.e. advantages normalised over the whole global batch of 16 logged
samples. Run broken.py and fixed.py on 2 ranks (8 samples each) and compare final parameters."""
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

# first optimizer step, computed here from the script's own data and sampler order
import importlib.util
from torch.utils.data import DistributedSampler
spec = importlib.util.spec_from_file_location("b", os.path.join(HERE, "broken.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
ds = mod.make_logged_data()
idx = [list(DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0))[:8] for r in range(2)]
r_local = [ds.tensors[2][i] for i in idx]
r_all = torch.cat(r_local)
adv_global = (r_all - r_all.mean()) / (r_all.std() + 1e-8)
adv_rank = torch.cat([(r - r.mean()) / (r.std() + 1e-8) for r in r_local])
print(f"step 1: rank batch reward means {r_local[0].mean():.3f} / {r_local[1].mean():.3f} (global {r_all.mean():.3f}); "
      f"max |per-rank advantage - global-batch advantage| = {(adv_rank - adv_global).abs().max():.3f}")
