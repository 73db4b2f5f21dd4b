#!/work/main/.venv/bin/python
"""Count DDP gradient all-reduces (via a counting comm hook installed from outside) and compare
final weights of broken.py and fixed.py on 2 ranks."""
import os
import runpy
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"

if len(sys.argv) == 3 and sys.argv[1] == "--child":
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    count = [0]

    def hook(state, bucket):
        count[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    orig_init = DDP.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        self.register_comm_hook(None, hook)

    DDP.__init__ = init
    runpy.run_path(sys.argv[2], run_name="__main__")
    with open(os.path.join(os.environ["STATE_DUMP_DIR"], f"count{os.environ['RANK']}"), "w") as fh:
        fh.write(str(count[0]))
    sys.exit(0)


def run(script):
    out = tempfile.mkdtemp()
    env = dict(os.environ, STATE_DUMP_DIR=out)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", __file__, "--child", script],
                       cwd=HERE, env=env, timeout=120, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = [int(open(os.path.join(out, f"count{r}")).read()) for r in range(2)]
    states = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    shutil.rmtree(out)
    return counts, states


res = {name: run(name + ".py") for name in ("broken", "fixed")}
for name, (counts, _) in res.items():
    print(f"{name}: gradient all-reduces over 3 optimizer steps: rank 0 {counts[0]}, rank 1 {counts[1]}")
b, f = res["broken"][1][0], res["fixed"][1][0]
print(f"final weights broken vs fixed (rank 0): max abs diff {max((b[k] - f[k]).abs().max().item() for k in b):.2e}")
