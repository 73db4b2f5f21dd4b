#!/usr/bin/env bash
# The checks that need a GPU, in under 5 minutes, for a maintainer with a CUDA machine:
#   1. a fork server with every lesson module (and DeepSpeed, if installed) preloaded forks
#      ranks that are not in torch's "bad fork" state and can use CUDA;
#   2. a world_size=1 NCCL launch (and world_size=2 with two GPUs) all-reduces on the GPU;
#   3. lesson 02's hard-coded `cuda:{rank}` and a few scenarios whose declarations depend on
#      the GPU run with one present, each declaration held or the difference printed.
# Run from the repository root:   PYTHONPATH=$PWD bash tools/gpu_check.sh
# It writes everything to $OUT/gpu_check.log ($OUT defaults to the current folder) and exits 0
# when every check passed. Missing pure-Python or binary dependencies (cloudpickle, tqdm, numpy,
# matplotlib) are installed into a temporary folder from .upgrade/gpu_wheels/ when that folder is
# there (cp312 wheels: `pip download --only-binary=:all: --python-version 3.12 --platform
# manylinux2014_x86_64 -d .upgrade/gpu_wheels matplotlib numpy cloudpickle tqdm`).
set -uo pipefail
OUT=${OUT:-$PWD}
LOG="$OUT/gpu_check.log"
PY=${PYTHON:-python3}
: > "$LOG"
say() { echo "$@" | tee -a "$LOG"; }

missing=$("$PY" -c "
import importlib.util as u
print(' '.join(m for m in ('cloudpickle', 'tqdm', 'numpy', 'matplotlib') if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
    say "missing: $missing"
    if [ -d .upgrade/gpu_wheels ]; then
        DEPS=$(mktemp -d)
        "$PY" -m pip install -q --no-index --find-links .upgrade/gpu_wheels --target "$DEPS" \
            $missing >> "$LOG" 2>&1 && say "installed into $DEPS from .upgrade/gpu_wheels"
        export PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 270 "$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import importlib.util
import pkgutil
import subprocess
import sys
import time
import warnings

import torch

import ddp_lab
from ddp_lab.launching import cuda_init
from ddp_lab.launching import processes as _procs
from ddp_lab.lessons import l02_device_and_dtype as l02
from ddp_lab.course.registry import get_scenario

START, FAILED = time.time(), []


def check(name, ok, detail=""):
    print(f"{'PASS' if ok else 'FAIL'}  {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILED.append(name)


def attempt(name, step):
    """Run one check; an exception is that check's failure, and the next one still runs."""
    try:
        step()
    except Exception as exc:  # noqa: BLE001
        check(name, False, f"{type(exc).__name__}: {exc}")


gpus = cuda_init.gpu_count()
real = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                      capture_output=True, text=True).stdout.strip()
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
      f"GPUs: {gpus} by NVML (cuda_init.gpu_count), {real} by torch.cuda.device_count()")
check("gpu_count() agrees with torch and leaves this process unpoisoned",
      str(gpus) == real and not cuda_init.forks_are_bad())

# 1. Every lesson module (and DeepSpeed) in the fork server; ranks that can use CUDA.
lessons = [f"ddp_lab.lessons.{m.name}" for m in pkgutil.iter_modules(
    __import__("ddp_lab.lessons").lessons.__path__) if m.name.startswith("l")]
def preload_everything():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", _procs.ForkServerPoisoned)
        warm = ddp_lab.prewarm(wait=True, timeout=180, modules=lessons)
        if importlib.util.find_spec("deepspeed"):
            from ddp_lab.lessons import l12_sharded_modules as l12
            warm = l12.prewarm_deepspeed(wait=True) and warm
        else:
            print("(DeepSpeed not installed: lesson 12's preload skipped)")
    check("every lesson module preloaded, no import initialised CUDA in the fork server",
          warm and not caught, "; ".join(str(w.message) for w in caught))


attempt("preload", preload_everything)


def on_gpu():
    import os

    import torch

    local = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
    bad = torch.cuda._is_in_bad_fork()
    x = torch.full((4,), float(local + 1), device=f"cuda:{local}")
    return {"bad_fork": bad, "sum": (x * 2).sum().item(), "device": torch.cuda.get_device_name(local)}


def ranks_use_cuda():
    r = ddp_lab.launch(on_gpu, world_size=2, backend="gloo", timeout=120)
    check("ranks forked from that server are not in a bad fork and compute on CUDA",
          r.ok and not any(v["bad_fork"] for v in r.values),
          repr(r.values) if r.ok else r.describe_failure()[:800])


attempt("ranks use CUDA", ranks_use_cuda)


# 2. NCCL.
def nccl_all_reduce():
    import torch
    import torch.distributed as dist

    t = torch.ones(3, device=torch.device("cuda", torch.cuda.current_device())) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return {"backend": dist.get_backend(), "value": t.tolist()}


def nccl(n):
    r = ddp_lab.launch(nccl_all_reduce, world_size=n, backend="nccl", timeout=120)
    want = float(n * (n + 1) // 2)
    check(f"NCCL launch, world_size={n}", r.ok and r.backend == "nccl"
          and all(v["value"] == [want] * 3 for v in r.values),
          repr(r.values) if r.ok else r.describe_failure()[:800])


for n in ([1, 2] if gpus >= 2 else [1]):
    attempt(f"NCCL launch, world_size={n}", lambda: nccl(n))


# 3. Lesson 02's hard-coded device, and scenarios whose declarations depend on a GPU.
def hardcoded(n):
    r = ddp_lab.launch(l02.hardcoded_cuda, world_size=n, grace=2, timeout=120)
    fits = n <= gpus
    print(f"l02.hardcoded_cuda, world_size={n}, {gpus} GPU(s):\n{r!r}")
    check(f"l02.hardcoded_cuda world_size={n}: " + ("runs, a GPU per rank" if fits else
          "a rank whose cuda:{rank} does not exist fails"),
          r.ok if fits else (not r.ok and not any(x.ok for x in r.ranks[gpus:])),
          "" if r.ok else r.root_cause.headline)


for n in (1, 2):
    attempt(f"l02.hardcoded_cuda world_size={n}", lambda: hardcoded(n))


def declared(key, variant):
    scenario = get_scenario(*key.split("/"))
    result = scenario.run(variant)
    problems = scenario.differences(variant, result)
    check(f"{key} {variant} as declared with {gpus} GPU(s) present", not problems,
          "; ".join(problems)[:600] or f"{result.status} on {result.backend}")


for key in ("02/constant_cast", "01/plain_tensor", "04/custom_function", "04/deprecated_amp",
            "09/map_location", "00/source_example"):
    for variant in ("broken", "fixed"):
        if time.time() - START > 230:
            print(f"(time is short: {key} {variant} not run)")
            continue
        attempt(f"{key} {variant}", lambda: declared(key, variant))
print(f"\n{len(FAILED)} failed: {', '.join(FAILED) or 'none'}; {time.time() - START:.0f} s")
sys.exit(1 if FAILED else 0)
EOF
code=${PIPESTATUS[0]}
say "gpu_check exit status $code (log: $LOG)"
exit "$code"
