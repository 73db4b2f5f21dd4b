"""Run broken.py and fixed.py under torchrun (2 ranks) and compare with an uninterrupted run of the
same 8 steps simulated in one process (both ranks' float16 backward passes, grads averaged, one
GradScaler): how many optimizer steps were really applied, the loss scale, and the final weights."""
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
    x, y = case.make_data()
    shards = [(x[r::2], y[r::2]) for r in range(2)]
    torch.manual_seed(0)
    model = case.make_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    scaler = torch.amp.GradScaler("cpu")
    scales = []
    for step in range(case.TOTAL_STEPS):
        opt.zero_grad()
        for xs, ys in shards:
            j = (step % (len(xs) // case.BATCH)) * case.BATCH
            with torch.autocast("cpu", dtype=torch.float16):
                out = model(xs[j:j + case.BATCH])
            scaler.scale(nn.functional.mse_loss(out.float(), ys[j:j + case.BATCH])).backward()
        for p in model.parameters():
            p.grad /= 2
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
    return scales, int(opt.state_dict()["state"][0]["step"]), model.state_dict()


def run(script, tmp):
    out = os.path.join(tmp, script)
    os.makedirs(out)
    env = dict(os.environ, FINAL_STATE_DIR=out, TMPDIR=tmp)
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script + ".py"], cwd=HERE,
                       env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    scales = [float(v) for v in re.findall(r"scale ([0-9.]+)", p.stdout)]
    return scales, [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


def maxdiff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main():
    ref_scales, ref_steps, ref_sd = reference(load("fixed"))
    print(f"uninterrupted: scale per step {[int(s) for s in ref_scales]}, Adam steps applied {ref_steps}/8")
    tmp = tempfile.mkdtemp()
    try:
        for script in ("broken", "fixed"):
            scales, states = run(script, tmp)
            applied = int(states[0]["optimizer"]["state"][0]["step"])
            print(f"{script:6s}: scale per step {[int(s) for s in scales]}, Adam steps applied {applied}/8, "
                  f"rank0 vs rank1 max|dparam| {maxdiff(states[0]['model'], states[1]['model']):.2e}, "
                  f"vs uninterrupted max|dparam| {maxdiff(states[0]['model'], ref_sd):.2e}")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
