"""Run broken.py and fixed.py under torchrun (2 ranks) and compare their final weights with two
single-process simulations of the same 8 steps (both ranks' batches averaged): the uninterrupted
run, whose steps 4-7 use the sampler orders of epochs 2 and 3, and a run whose steps 4-7 reuse
the orders of epochs 0 and 1."""
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


def order(ds, rank, epoch):
    s = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
    s.set_epoch(epoch)
    return list(s)


def simulate(case, epochs):
    ds = case.make_dataset()
    torch.manual_seed(0)
    model = case.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for epoch in epochs:
        idx = [order(ds, r, epoch) for r in range(2)]
        for i in range(2):
            losses = [nn.functional.cross_entropy(model(ds[idx[r][4 * i:4 * i + 4]][0]), ds[idx[r][4 * i:4 * i + 4]][1])
                      for r in range(2)]
            opt.zero_grad()
            (0.5 * (losses[0] + losses[1])).backward()
            opt.step()
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
    case = load("fixed")
    ds = case.make_dataset()
    for e in range(4):
        print(f"rank 0 sample order, epoch {e}: {order(ds, 0, e)}")
    uninterrupted = simulate(case, [0, 1, 2, 3])
    replayed = simulate(case, [0, 1, 0, 1])
    print(f"uninterrupted vs replayed-order simulation max|dparam| {maxdiff(uninterrupted, replayed):.2e}")
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            sds = run(script, tmp)
            print(f"{script:6s}: rank0 vs rank1 {maxdiff(sds[0], sds[1]):.2e}; vs uninterrupted "
                  f"{maxdiff(sds[0], uninterrupted):.2e}; vs epochs-0,1-replayed {maxdiff(sds[0], replayed):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
