#!/work/main/.venv/bin/python
"""Run broken.py and fixed.py on 2 ranks, dump each rank's final state_dict, compare."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script):
    out = tempfile.mkdtemp()
    env = dict(os.environ, STATE_DUMP_DIR=out)
    subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE, env=env,
                   check=True, timeout=120, capture_output=True)
    states = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    shutil.rmtree(out)
    return states


b, f = run("broken.py"), run("fixed.py")
params = [k for k in b[0] if "running" not in k and "num_batches" not in k]
for name, s in (("broken", b), ("fixed", f)):
    ranks = max((s[0][k].float() - s[1][k].float()).abs().max().item() for k in params)
    print(f"{name}: rank0 BN num_batches_tracked={int(s[0]['1.num_batches_tracked'])} "
          f"rank0 BN running_mean[:3]={[round(v, 3) for v in s[0]['1.running_mean'][:3].tolist()]} "
          f"max param diff between ranks={ranks:.1e}")
d = max((b[0][k] - f[0][k]).abs().max().item() for k in params)
print(f"broken vs fixed final weights (rank 0): max abs diff {d:.3e}")
