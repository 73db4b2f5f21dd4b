"""What a script observes about its world under `ddp-lab watch` is what it observes under
`torchrun --standalone --nproc-per-node 2` (issue 44; docs/watch.md, "What watch changes in a
run"): the environment torchrun's agent gives a worker, the working directory, `sys.argv` as
typed, `sys.path[0]`, unbuffered streams, SIGINT, rank and world, and seeds that differ per rank
and per run; the script's non-daemon threads and atexit functions run when it ends. The one
difference a fork cannot remove, the string-hash seed shared by the ranks, is asserted too, so
that the day it is gone the docs are corrected."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script

pytestmark = [pytest.mark.usefixtures("no_leftovers"), pytest.mark.slow]

PROBE = r'''
import atexit, json, os, random, signal, sys, threading, time
import numpy as np
import torch
import torch.distributed as dist

out = sys.argv[1]
seen = {"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv, "path0": sys.path[0],
        "file": __file__, "stdin": os.path.realpath("/proc/self/fd/0"),
        "write_through": sys.stdout.write_through, "sigint": repr(signal.getsignal(signal.SIGINT)),
        "threads": torch.get_num_threads(), "seed": torch.initial_seed(),
        "random": random.random(), "numpy": float(np.random.rand()), "hash": hash("ddp-lab")}
dist.init_process_group("gloo")
seen.update(rank=dist.get_rank(), world=dist.get_world_size())
rank = dist.get_rank()
with open(os.path.join(out, f"seen{rank}.json"), "w") as f:
    json.dump(seen, f)
opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
opt.step()
dist.destroy_process_group()

def late(name):  # what Python waits for, and runs, when the script ends
    time.sleep(0.3)
    open(os.path.join(out, f"{name}{rank}"), "w").close()
threading.Thread(target=late, args=("thread",)).start()
atexit.register(lambda: open(os.path.join(out, f"atexit{rank}"), "w").close())
'''
# Equal under both: what torchrun's agent sets (local_elastic_agent.py, run.py, launcher/api.py)
SAME = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_SIGNALS_TO_HANDLE")
PER_RUN = ("MASTER_PORT", "TORCHELASTIC_RUN_ID")  # one value per job, shared by its ranks
PER_RANK = ("TORCHELASTIC_ERROR_FILE",)  # a path of torchrun's (or watch's) own per worker
# set by torch itself when torch._dynamo is imported (torch/_inductor/runtime/cache_dir_utils.py):
# the caller imported it before, the script would import it itself
TORCH_SETS = ("TORCHINDUCTOR_CACHE_DIR",)


def _seen(folder, n=2):
    out = []
    for r in range(n):
        with open(os.path.join(folder, f"seen{r}.json")) as f:
            out.append(json.load(f))
    return out


def _added(seen: dict) -> dict:
    """The variables the launcher added or changed, against this test's own environment."""
    return {k: v for k, v in seen["env"].items()
            if os.environ.get(k) != v and k not in TORCH_SETS}


def _torchrun(tmp_path, out):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "train.py", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL,  # torchrun passes its stdin on; watch: none
                          env=dict(os.environ))  # the environment watch starts from (not C's)
    assert done.returncode == 0, done.stderr[-3000:]
    return _seen(out)


def _watch(tmp_path, out, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the caller's directory, though the fork server began elsewhere
    lines = []
    report = watch_script("train.py", [str(out)], timeout=60,
                          output=lambda r, stream, line: lines.append((r, stream, line)))
    assert report.status == "ok" and report.steps == 1, report.text()
    return _seen(out), report


def test_a_script_sees_the_world_torchrun_gives_it(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(textwrap.dedent(PROBE))
    outs = {name: tmp_path / name for name in ("torchrun", "watch1", "watch2")}
    for out in outs.values():
        out.mkdir()
    ref = _torchrun(tmp_path, outs["torchrun"])
    runs = [_watch(tmp_path, outs[name], monkeypatch)[0] for name in ("watch1", "watch2")]
    for name, seen in zip(("watch1", "watch2"), runs):
        for r in (0, 1):
            t, w = _added(ref[r]), _added(seen[r])
            assert set(w) == set(t), f"rank {r}: only torchrun {set(t) - set(w)}, only watch {set(w) - set(t)}"
            assert {k: w[k] for k in SAME} == {k: t[k] for k in SAME}
            assert w["TORCHELASTIC_ERROR_FILE"].endswith("error.json")
            for key in ("cwd", "path0", "file", "stdin", "write_through", "sigint",
                        "threads", "rank", "world"):
                assert seen[r][key] == ref[r][key], (key, seen[r][key], ref[r][key])
        assert ref[0]["argv"] == ["train.py", str(outs["torchrun"])]
        assert seen[0]["argv"] == seen[1]["argv"] == ["train.py", str(outs[name])]  # as typed
        assert all(seen[0]["env"][k] == seen[1]["env"][k] for k in PER_RUN)
        assert seen[0]["env"]["TORCHELASTIC_ERROR_FILE"] != seen[1]["env"]["TORCHELASTIC_ERROR_FILE"]
        for key in ("seed", "random", "numpy"):  # each rank its own, as under torchrun
            assert ref[0][key] != ref[1][key] and seen[0][key] != seen[1][key], key
    assert runs[0][0]["seed"] != runs[1][0]["seed"]  # and each run its own
    assert runs[0][0]["env"]["TORCHELASTIC_RUN_ID"] != runs[1][0]["env"]["TORCHELASTIC_RUN_ID"]
    # the difference a fork cannot remove (docs/watch.md): one string-hash seed for the ranks
    assert ref[0]["hash"] != ref[1]["hash"]
    assert runs[0][0]["hash"] == runs[0][1]["hash"]
    for name in ("torchrun", "watch1", "watch2"):  # non-daemon threads, then atexit, as Python
        assert sorted(os.listdir(outs[name])) == ["atexit0", "atexit1", "seen0.json",
                                                  "seen1.json", "thread0", "thread1"], name


def test_the_script_output_comes_as_it_runs_prefixed_as_torchrun_tee_does(tmp_path, monkeypatch):
    """Each line as `torchrun --tee 3` shows it ([default0]:), from stdout and stderr, while the
    script still runs (rank 0's first line arrives before its last is written)."""
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        print(f"first from {dist.get_rank()}")
        print(f"warning from {dist.get_rank()}", file=sys.stderr)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        opt.step()
        time.sleep(1.5)
        print("last", end="")  # no newline: passed on when the rank ends
        dist.destroy_process_group()
    '''))
    monkeypatch.chdir(tmp_path)
    got = []
    import time

    report = watch_script("train.py", timeout=30,
                          output=lambda r, s, line: got.append((time.time(), r, s, line)))
    assert report.status == "ok"
    lines = {(r, s, line) for _, r, s, line in got}
    for r in (0, 1):
        assert {(r, "stdout", f"first from {r}\n"), (r, "stderr", f"warning from {r}\n"),
                (r, "stdout", "last")} <= lines, got
    first = next(t for t, r, s, line in got if line.startswith("first from 0"))
    last = next(t for t, r, s, line in got if r == 0 and line == "last")
    assert last - first > 1.0  # shown as it ran, not after the run
