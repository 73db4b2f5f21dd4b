"""Wall time of one 2-rank launch of the same work (gloo init + all_reduce + teardown), measured in
one run on this machine: ddp_lab.launch (first and warm), torch.multiprocessing.spawn, torchrun,
and accelerate's notebook_launcher (only if accelerate is installed; it is not a dependency).

    .venv/bin/python benchmarks/launch_speed.py [--repeat 5]

Each contender runs in a fresh interpreter (so none inherits another's warm state), which
times its own launches from the moment it calls the launcher. "first" is the first launch of
that interpreter; "warm" the median of the later ones (for ddp_lab: once the fork server has
finished preloading, as it does while a notebook is idle).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

WORK = """
import os, socket, time
import torch, torch.distributed as dist

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def work_in_group():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

def work(rank=None, world_size=2):
    # what spawn, torchrun and notebook_launcher run: init, all_reduce, teardown
    if rank is not None:
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
    dist.init_process_group("gloo")
    work_in_group()
    dist.destroy_process_group()
"""

CONTENDERS = {
    "ddp_lab.launch": """
import ddp_lab
times = []
for i in range(REPEAT + 1):
    t0 = time.perf_counter(); r = ddp_lab.launch(work_in_group); times.append(time.perf_counter() - t0)
    assert r.ok, r
    if i == 0:
        ddp_lab.prewarm(wait=True)  # warm: the fork server has preloaded what DDP imports
print(json.dumps({"first": times[0], "warm": times[1:]}))
""",
    "torch.multiprocessing.spawn": """
import torch.multiprocessing as mp
times = []
for i in range(REPEAT):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    t0 = time.perf_counter(); mp.spawn(work, nprocs=2); times.append(time.perf_counter() - t0)
print(json.dumps({"first": times[0], "warm": times[1:] or times}))
""",
    "accelerate.notebook_launcher": """
from accelerate import notebook_launcher
times = []
for i in range(REPEAT):
    t0 = time.perf_counter(); notebook_launcher(work, num_processes=2, use_port=str(free_port()))
    times.append(time.perf_counter() - t0)
print(json.dumps({"first": times[0], "warm": times[1:] or times}))
""",
    "torchrun --nproc-per-node 2": """
import subprocess, sys, tempfile
script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
script.write(WORK_SOURCE + "\\nwork()\\n"); script.close()
times = []
for i in range(REPEAT):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), script.name], check=True, capture_output=True)
    times.append(time.perf_counter() - t0)
os.unlink(script.name)
print(json.dumps({"first": times[0], "warm": times[1:] or times}))
""",
}


def measure(name: str, repeat: int) -> dict | None:
    if name.startswith("accelerate"):
        try:
            import accelerate  # noqa: F401
        except ImportError:
            return None
    body = textwrap.indent(textwrap.dedent(CONTENDERS[name]), "    ")
    source = (f"import json\n{WORK}\nREPEAT = {repeat}\nWORK_SOURCE = {WORK!r}\n"
              f"if __name__ == '__main__':\n{body}")
    with tempfile.TemporaryDirectory() as tmp:  # spawn re-imports the main script: give it a file
        script = os.path.join(tmp, "contender.py")
        with open(script, "w") as f:
            f.write(source)
        proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = {name: measure(name, args.repeat) for name in CONTENDERS}
    ours = statistics.median(rows["ddp_lab.launch"]["warm"])
    print(f"{'launcher':<30} {'first (s)':>10} {'warm median (s)':>16} {'warm ddp_lab / this':>20}")
    for name, row in rows.items():
        if row is None:
            print(f"{name:<30} {'(not installed)':>10}")
            continue
        warm = statistics.median(row["warm"])
        print(f"{name:<30} {row['first']:>10.2f} {warm:>16.3f} {ours / warm:>20.2f}")


if __name__ == "__main__":
    main()
