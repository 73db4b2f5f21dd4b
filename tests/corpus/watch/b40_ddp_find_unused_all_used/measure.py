"""Run broken.py and fixed.py under torchrun (2 CPU ranks) and compare: the final parameters,
DDP's own logging data (find_unused_parameters, unused_parameter_size, forward time) and the
step times. Usage: python measure.py"""
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    out = tempfile.mkdtemp(prefix="b40_")
    try:
        env = dict(os.environ, TRAIN_STATS_DIR=out)
        p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                           cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
        ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
        warned = "did not find any unused parameters" in p.stderr
        return ranks, warned
    finally:
        shutil.rmtree(out, ignore_errors=True)


def summary(name, ranks, warned):
    d = ranks[0]["ddp"]
    # skip the first step of each run (bucket setup, warm-up)
    steps = [t for r in ranks for t in r["step_times"][1:]]
    print(f"{name}: find_unused_parameters={d['find_unused_parameters']} "
          f"unused_parameter_size={d['unused_parameter_size']} iterations={d['iteration'] + 1} "
          f"reducer_warning={warned} "
          f"median step {1e3 * statistics.median(steps):.2f} ms "
          f"avg DDP forward {d['avg_forward_compute_time'] / 1e3:.0f} us")
    return steps


def graph_nodes():
    """Autograd nodes reachable from the model's output: what DDP walks after every forward
    when find_unused_parameters=True (same model and batch shape as the scripts)."""
    spec = importlib.util.spec_from_file_location("broken", os.path.join(HERE, "broken.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    out = mod.ResMLP()(torch.randn(32, 8))
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo.extend(nxt for nxt, _ in fn.next_functions)
    return len(seen)


def main():
    b, wb = run("broken.py")
    f, wf = run("fixed.py")
    sb = summary("broken", b, wb)
    sf = summary("fixed ", f, wf)
    diff = max((b[0]["state"][k] - f[0]["state"][k]).abs().max().item() for k in b[0]["state"])
    same = all(torch.equal(b[0]["state"][k], b[1]["state"][k]) for k in b[0]["state"])
    print(f"max |param broken - param fixed| = {diff:.3g}; broken ranks identical: {same}")
    print(f"autograd nodes walked per step by the unused-parameter search: {graph_nodes()}")
    ratio = statistics.median(sb) / statistics.median(sf)
    print(f"median step time broken/fixed (wall clock, noisy on a shared host) = {ratio:.2f}")


if __name__ == "__main__":
    main()
