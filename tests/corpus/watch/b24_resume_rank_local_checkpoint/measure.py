"""Run broken.py and fixed.py under torchrun (2 ranks): compare the two ranks' final weights with
each other and with an uninterrupted 4-epoch run simulated in one process (both ranks' batches
averaged)."""
import sys
import importlib.util, os, shutil, subprocess, tempfile
import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(case):
    ds = case.make_dataset()
    torch.manual_seed(0)
    model = case.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for epoch in range(2 * case.EPOCHS_PER_RUN):
        idx = []
        for r in range(2):
            s = DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0)
            s.set_epoch(epoch)
            idx.append(list(s))
        for i in range(len(idx[0]) // 4):
            batches = [ds[idx[r][4 * i:4 * i + 4]] for r in range(2)]
            loss = sum(nn.functional.mse_loss(model(x), y) for x, y in batches) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    return model.state_dict()


def run(script, tmp):
    out = os.path.join(tmp, script)
    os.makedirs(out)
    env = dict(os.environ, FINAL_STATE_DIR=out, TMPDIR=tmp)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script + ".py"], cwd=HERE,
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main():
    ref = reference(load("fixed"))
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            sds = run(script, tmp)
            print(f"{script:6s}: rank0 vs rank1 max|dparam| {maxdiff(sds[0], sds[1]):.2e}; "
                  f"vs uninterrupted: rank0 {maxdiff(sds[0], ref):.2e}, rank1 {maxdiff(sds[1], ref):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
