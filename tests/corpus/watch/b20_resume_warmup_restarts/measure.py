"""Run broken.py and fixed.py under torchrun (2 ranks) and compare with an uninterrupted
single-process run on the same global batches: the lr used at every step and the final weights."""
import importlib.util, os, re, shutil, subprocess, sys, tempfile
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
    """Uninterrupted training: 4 epochs, the 2 ranks' batches averaged in one process."""
    torch.manual_seed(0)
    model = case.make_model()
    ds = case.make_dataset()
    samplers = [DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0) for r in range(2)]
    opt = torch.optim.SGD(model.parameters(), lr=case.BASE_LR, momentum=0.9)
    steps_per_epoch = len(samplers[0]) // 4
    sched = torch.optim.lr_scheduler.LambdaLR(opt, case.warmup_cosine(case.TOTAL_EPOCHS * steps_per_epoch))
    lrs = []
    for epoch in range(case.TOTAL_EPOCHS):
        for s in samplers:
            s.set_epoch(epoch)
        idx = [list(s) for s in samplers]
        for i in range(steps_per_epoch):
            lrs.append(opt.param_groups[0]["lr"])
            x0, y0 = ds[idx[0][4 * i:4 * i + 4]]
            x1, y1 = ds[idx[1][4 * i:4 * i + 4]]
            loss = 0.5 * (nn.functional.mse_loss(model(x0), y0) + nn.functional.mse_loss(model(x1), y1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return lrs, model.state_dict()


def run(script, tmp):
    out = os.path.join(tmp, script)
    os.makedirs(out)
    env = dict(os.environ, FINAL_STATE_DIR=out, TMPDIR=tmp)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script + ".py"], cwd=HERE,
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    lrs = [float(v) for v in re.findall(r"lr ([0-9.]+)", p.stdout)]
    return lrs, [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main():
    ref_lrs, ref_sd = reference(load("fixed"))
    print("uninterrupted lr per step:", " ".join(f"{v:.5f}" for v in ref_lrs))
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            lrs, sds = run(script, tmp)
            print(f"{script:6s} lr per step:      ", " ".join(f"{v:.5f}" for v in lrs))
            print(f"{script:6s} rank0 vs rank1 max|dparam| {maxdiff(sds[0], sds[1]):.2e}; "
                  f"vs uninterrupted max|dparam| {maxdiff(sds[0], ref_sd):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
