"""Run both scripts on 2 ranks; each rank dumps its train/validation split. Count the validation
samples (as evaluated, i.e. each rank's half of its own val split) that some rank trained on."""
import sys
import os, re, shutil, subprocess, tempfile
import torch
from torch.utils.data import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, STATE_DUMP_DIR=d, TMPDIR=d)  # torchrun scratch dirs go in d too
        out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", script], cwd=HERE, env=env,
                             check=True, timeout=180, capture_output=True, text=True).stdout
        return out, [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(2)]
    finally:
        shutil.rmtree(d)


for name in ("broken.py", "fixed.py"):
    out, dumps = run(name)
    trained, validated = set(), set()
    for r, dmp in enumerate(dumps):
        for epoch in range(2):  # the script's train sampler: shuffle=True, seed=42, set_epoch(epoch)
            s = DistributedSampler(range(64), num_replicas=2, rank=r, shuffle=True, seed=42)
            s.set_epoch(epoch)
            trained |= {dmp["train_idx"][i] for i in s}
        validated |= {dmp["val_idx"][i] for i in DistributedSampler(range(16), num_replicas=2, rank=r, shuffle=False)}
    same = dumps[0]["val_idx"] == dumps[1]["val_idx"]
    pdiff = max((a - b).abs().max().item() for a, b in zip(dumps[0]["model"].values(), dumps[1]["model"].values()))
    acc = re.findall(r"val acc ([0-9.]+)", out)[-1]
    print(f"{name}: ranks' val splits identical: {same}; {len(validated & trained)}/{len(validated)} validated samples "
          f"were trained on; distinct samples trained on {len(trained)}/80; final printed val acc {acc}; rank0 vs rank1 params {pdiff:.1e}")
