#!/work/main/.venv/bin/python
"""Compare the 2-rank runs of broken.py and fixed.py with one process training on the same global
batches (both ranks' sequences together, cross-entropy averaged over all their real tokens)."""
import importlib.util
import os
import shutil
import subprocess
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"

spec = importlib.util.spec_from_file_location("case", os.path.join(HERE, "broken.py"))
case = importlib.util.module_from_spec(spec)
spec.loader.exec_module(case)


def run(script):
    out = tempfile.mkdtemp()
    env = dict(os.environ, STATE_DUMP_DIR=out)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script], cwd=HERE, env=env,
                       timeout=120, capture_output=True)
    assert p.returncode == 0, p.stderr[-2000:]
    states = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    shutil.rmtree(out)
    return states


def reference():
    torch.manual_seed(0)
    model = case.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2))
    inputs, labels = case.make_corpus()
    shards = [(inputs[r::2], labels[r::2]) for r in range(2)]
    for step in range(4):
        x = torch.cat([s[0][step * 4:(step + 1) * 4] for s in shards])
        y = torch.cat([s[1][step * 4:(step + 1) * 4] for s in shards])
        if step == 0:
            print("real tokens in step 0: rank 0", int((y[:4] != -100).sum()), "rank 1", int((y[4:] != -100).sum()))
        loss = F.cross_entropy(model(x).reshape(-1, case.VOCAB), y.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.state_dict()


ref = reference()
for name in ("broken", "fixed"):
    s = run(name + ".py")
    ranks = max((s[0][k] - s[1][k]).abs().max().item() for k in ref)
    vs_ref = max((s[0][k] - ref[k]).abs().max().item() for k in ref)
    print(f"{name}: rank0 vs rank1 max diff {ranks:.2e}; rank0 vs one-process reference max diff {vs_ref:.2e}")
