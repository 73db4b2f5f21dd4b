"""Run both scripts on 2 ranks, take the final parameters, and evaluate them here in one process on
the 7 validation samples; compare with the validation loss/accuracy rank 0 printed for the last epoch."""
import sys
import importlib.util, os, re, shutil, subprocess, tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script
spec = importlib.util.spec_from_file_location("b", os.path.join(HERE, "broken.py"))
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
x, y = mod.make_split(7, seed=2).tensors

for name in ("broken.py", "fixed.py"):
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, STATE_DUMP_DIR=d, TMPDIR=d)  # torchrun scratch dirs go in d too
        out = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", name], cwd=HERE, env=env,
                             check=True, timeout=180, capture_output=True, text=True).stdout
        sd, sd1 = (torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(2))
        pdiff = max((a - b).abs().max().item() for a, b in zip(sd.values(), sd1.values()))
    finally:
        shutil.rmtree(d)
    loss_p, acc_p = map(float, re.findall(r"epoch 1 val loss ([0-9.]+) val acc ([0-9.]+)", out)[0])
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 2)); net.load_state_dict(sd)
    with torch.no_grad():
        logits = net(x)
    loss_t, acc_t = F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()
    print(f"{name}: printed val loss {loss_p:.5f} acc {acc_p:.4f}; true on the 7 samples loss {loss_t:.5f} "
          f"acc {acc_t:.4f}; loss error {loss_p - loss_t:+.5f}; rank0 vs rank1 params {pdiff:.1e}")
