"""Run broken.py and fixed.py on 2 ranks, load each rank's final parameters and compare the ranks."""
import os
import shutil
import subprocess
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script, nproc=2):
    out = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RUN_EXPORT_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script],
                           cwd=HERE, env=env, check=True, timeout=120, capture_output=True, text=True)
        last = [l for l in p.stdout.splitlines() if l.startswith("step")][-1]
        return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(nproc)], last
    finally:
        shutil.rmtree(out)


def main():
    for script in ["broken.py", "fixed.py"]:
        sds, last = run(script)
        diffs = {k: (sds[0][k].float() - sds[1][k].float()).abs().max().item() for k in sds[0]}
        worst = max(diffs, key=diffs.get)
        print(f"{script}: rank0 vs rank1 max |param diff| = {diffs[worst]:.3e} ({worst}); "
              f"tensors that differ: {sum(v > 0 for v in diffs.values())}/{len(diffs)}; last '{last}'")


if __name__ == "__main__":
    main()
