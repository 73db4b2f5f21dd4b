"""Run broken.py and fixed.py under torchrun (2 CPU ranks) with TORCH_LOGS=recompiles and count,
per rank, how often dynamo recompiled the model's forward (and whether it gave up at the
recompile limit and fell back to eager); also compare the printed losses.
Usage: python measure.py"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")  # the venv running this script


def run(script):
    env = dict(os.environ, TORCH_LOGS="recompiles")
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", "2", script],
                       cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        sys.exit(f"{script} failed:\n{p.stderr[-2000:]}")
    recompiles = [len(re.findall(rf"\[rank{r}\]:.*Recompiling function forward in \S*/{script}",
                                 p.stderr)) for r in range(2)]
    limit = [bool(re.search(rf"\[rank{r}\]:.*hit config.recompile_limit", p.stderr))
             for r in range(2)]
    reasons = sorted(set(re.findall(r"- \d+/\d+: (self\.\w+ == \d+)", p.stderr)))
    losses = re.findall(r"loss (\S+)", p.stdout)
    return recompiles, limit, reasons, losses


def main():
    for script in ("broken.py", "fixed.py"):
        rec, limit, reasons, losses = run(script)
        shown = f"{reasons[0]} .. {reasons[-1]}" if reasons else "none"
        print(f"{script}: recompiles of forward per rank {rec} in 10 steps; "
              f"hit recompile_limit {limit}; guard failures {shown}; losses {' '.join(losses)}")


if __name__ == "__main__":
    main()
