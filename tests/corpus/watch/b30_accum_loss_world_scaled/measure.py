"""Run broken.py and fixed.py on 2 ranks and fixed.py on 1 rank (same global batch of 16:
the single-process reference); compare the final parameters and how far they moved from init."""
import importlib.util, os, subprocess, sys, tempfile, shutil
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script, nproc):
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, STATE_DUMP_DIR=d, TMPDIR=d)  # torchrun scratch dirs go in d too
        subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script], cwd=HERE, env=env,
                       check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(nproc)]
    finally:
        shutil.rmtree(d)


def flat(sd):
    return torch.cat([v.flatten() for v in sd.values()])


spec = importlib.util.spec_from_file_location("b", os.path.join(HERE, "broken.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
torch.manual_seed(0)
init = flat(mod.build_model().state_dict())

ref = flat(run("fixed.py", 1)[0])
for name in ("broken.py", "fixed.py"):
    ranks = [flat(sd) for sd in run(name, 2)]
    spread = (ranks[0] - ranks[1]).abs().max().item()
    moved = (ranks[0] - init).norm().item() / (ref - init).norm().item()
    diff = (ranks[0] - ref).abs().max().item()
    print(f"{name}: rank0 vs rank1 max diff {spread:.1e}; distance moved from init = {moved:.3f} x single-process;"
          f" max |param - single-process| {diff:.2e}")
