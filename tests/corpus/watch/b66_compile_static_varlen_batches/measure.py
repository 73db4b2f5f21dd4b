"""Run broken.py and fixed.py on 2 ranks with TORCH_LOGS=recompiles; count per rank how many times
dynamo recompiled, whether it hit the recompile limit (after which new shapes run eagerly), the
wall time, and check that both versions print the same losses."""
import os
import re
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = "/work/main/.venv/bin/torchrun"


def run(script):
    env = dict(os.environ, TORCH_LOGS="recompiles")
    t0 = time.time()
    p = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", script],
                       cwd=HERE, env=env, timeout=180, capture_output=True, text=True)
    wall = time.time() - t0
    text = p.stdout + p.stderr
    rec = {r: len(re.findall(rf"\[rank{r}\]:.*Recompiling function", text)) for r in (0, 1)}
    limit = {r: len(re.findall(rf"\[rank{r}\]:.*hit config\.(recompile_limit|cache_size_limit)", text))
             for r in (0, 1)}
    losses = re.findall(r"loss (\S+)", p.stdout)
    return p.returncode, rec, limit, losses, wall


def main():
    res = {}
    for script in ["broken.py", "fixed.py"]:
        rc, rec, limit, losses, wall = run(script)
        res[script] = losses
        print(f"{script}: rc={rc} steps={len(losses)} recompiles per rank={rec} "
              f"recompile-limit hits per rank={limit} wall={wall:.1f}s")
    print(f"same printed losses in both: {res['broken.py'] == res['fixed.py']}")


if __name__ == "__main__":
    main()
