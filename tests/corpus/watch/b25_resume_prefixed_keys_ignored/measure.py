"""Run broken.py and fixed.py under torchrun (2 ranks) and compare with an uninterrupted two-pass
run simulated in one process (both ranks' batches averaged): the loss printed at the first step
after the restart, against the same batch's loss under the freshly initialised model and under
the model as it was checkpointed, and the final weights."""
import sys
import importlib.util, os, re, shutil, subprocess, tempfile
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
    shards = [list(case.Stream(32, r, 2)) for r in range(2)]
    batches = [[(torch.stack([s[0] for s in sh[i:i + 4]]), torch.stack([s[1] for s in sh[i:i + 4]]))
                for i in range(0, len(sh), 4)] for sh in shards]
    torch.manual_seed(0)
    model = case.make_model()
    x0, y0 = batches[0][0]
    with torch.no_grad():
        fresh = nn.functional.mse_loss(model(x0), y0).item()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        if epoch == 1:
            with torch.no_grad():
                ckpted = nn.functional.mse_loss(model(x0), y0).item()
        for i in range(len(batches[0])):
            loss = sum(nn.functional.mse_loss(model(x), y) for x, y in (batches[0][i], batches[1][i])) / 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    return fresh, ckpted, model.state_dict()


def run(script, tmp):
    out = os.path.join(tmp, script)
    os.makedirs(out)
    env = dict(os.environ, FINAL_STATE_DIR=out, TMPDIR=tmp)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script + ".py"], cwd=HERE,
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    first = float(re.search(r"epoch 1 step 0 loss ([0-9.]+)", p.stdout).group(1))
    return first, [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main():
    fresh, ckpted, ref = reference(load("fixed"))
    print(f"rank 0 first batch loss: fresh init {fresh:.4f}, checkpointed model {ckpted:.4f}")
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            first, sds = run(script, tmp)
            print(f"{script:6s}: first loss after restart {first:.4f}; rank0 vs rank1 max|dparam| "
                  f"{maxdiff(sds[0], sds[1]):.2e}; vs uninterrupted max|dparam| {maxdiff(sds[0], ref):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
