"""Run broken.py and fixed.py under torchrun (2 CPU ranks) with TORCH_LOGS=graph_breaks and
compare the graph breaks dynamo reports and the printed losses; then ask torch._dynamo.explain
how many graphs one forward of each version's model is split into.
Usage: python measure.py"""
import importlib.util
import os
import re
import subprocess
import sys

import torch
import torch._dynamo

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    env = dict(os.environ, TORCH_LOGS="graph_breaks")
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
    # only the breaks located in the script itself (DDP's own wrapper breaks occur in both)
    breaks = len(re.findall(rf"Graph break in user code at \S*/{script}:", p.stderr))
    losses = re.findall(r"loss (\S+)", p.stdout)
    return breaks, losses


def explain(script):
    spec = importlib.util.spec_from_file_location(script[:-3], os.path.join(HERE, script))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.Classifier()
    x, _ = mod.make_data()
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(x[:16])
    reasons = sorted({r.reason.splitlines()[0][:60] for r in e.break_reasons})
    return e.graph_count, e.graph_break_count, reasons


def main():
    for script in ("broken.py", "fixed.py"):
        breaks, losses = run(script)
        graphs, n_breaks, reasons = explain(script)
        print(f"{script}: graph breaks in the script, 2-rank run = {breaks}; "
              f"explain: {graphs} graph(s), {n_breaks} break(s) per forward {reasons}; "
              f"losses {' '.join(losses)}")


if __name__ == "__main__":
    main()
