"""Run broken.py and fixed.py under torchrun (2 ranks) and compare with an uninterrupted run of the
same 8 optimizer steps simulated in one process (both ranks' micro-batches, grads averaged): how
many steps the final AdamW state has counted, its second moments, and the final weights."""
import sys
import importlib.util, os, shutil, subprocess, tempfile
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(case):
    x, y = case.make_data()
    shards = [(x[r::2], y[r::2]) for r in range(2)]
    torch.manual_seed(0)
    model = case.make_model()
    opt = case.make_optimizer(model)
    per_step = case.MICRO * case.ACCUM
    for step in range(case.TOTAL_STEPS):
        opt.zero_grad()
        for xs, ys in shards:
            j = (step % (len(xs) // per_step)) * per_step
            for k in range(case.ACCUM):
                sl = slice(j + k * case.MICRO, j + (k + 1) * case.MICRO)
                (nn.functional.mse_loss(model(xs[sl]), ys[sl]) / case.ACCUM / 2).backward()
        opt.step()
    return model.state_dict(), opt.state_dict()


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


def summary(osd):
    st = osd["state"][0]
    return f"AdamW step count {int(st['step'])}, first weight exp_avg_sq sum {st['exp_avg_sq'].sum().item():.3e}"


def main():
    ref_sd, ref_osd = reference(load("fixed"))
    print(f"uninterrupted: {summary(ref_osd)}")
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            st = run(script, tmp)
            print(f"{script:6s}: {summary(st[0]['optimizer'])}; rank0 vs rank1 max|dparam| "
                  f"{maxdiff(st[0]['model'], st[1]['model']):.2e}; vs uninterrupted max|dparam| "
                  f"{maxdiff(st[0]['model'], ref_sd):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
