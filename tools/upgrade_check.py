"""Run the course on another PyTorch, in an environment of its own, and say what changed.

    .venv/bin/python tools/upgrade_check.py --torch 2.14.1 [--venv DIR] [--cpu] [--ci] [--report-only]

Run it with the pinned environment's Python (the baseline). It
1. makes DIR (default `.upgrade/torch-VERSION`, ignored by git) a virtualenv with `torch==VERSION`
   and the course's other requirements, as a plain `pip install` gives them: on Linux the CUDA
   build, GPU or not (`--cpu` keeps requirements.txt's CPU wheel index); `ddp_lab` itself is
   installed from this checkout (editable). An existing DIR with that torch is reused;
2. builds DeepSpeed's op there (`ddp-lab build-ops`, into DIR/torch_extensions, so that two
   environments never rebuild each other's);
3. runs the tour in both environments and strict nbval (`pytest notebooks/`, the committed
   outputs as reference) in the new one, recording each (tools/upgrade_record.py);
4. prints, per scenario and per notebook cell, what changed, sorted into: declaration not met
   (a scenario's outcome, or a cell's own assert), a cell that raised, PyTorch's message changed
   (an error or warning line reads differently), other output changed, and formatting only
   (the same once whitespace, line numbers and traceback carets are set aside).
A scenario variant whose declaration carries a measured rate for the new torch
(`Variant.measured`, e.g. 06/debug_detail on 2.14: a crash that comes and goes) and misses it is
reported as "known nondeterministic on this build" and does not fail; any other miss does.
`--ci` is the part `.ci/run` runs after the pinned suite: install, build-ops, the tour in the new
environment only (no baseline tour, no nbval: those stay in the full check, run when a torch
release comes), and the tests that mean something only on a CUDA build (CUDA_TESTS), which must
run there, not skip, with the private torch names the course reads (NEW_TORCH_TESTS).
A torch older than the course's floor (`ddp_lab.kit.preflight.MIN_TORCH`, 2.12: lesson 17's
elastic restart needs torchrun's `--shutdown-timeout`) is refused before anything is installed.
`--report-only` prints the report again from the last records in DIR. Exit status 0 when the
tour is as declared (known nondeterministic variants aside) and strict nbval passes there (with
`--ci`: and the CUDA-build tests pass).
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MESSAGE = re.compile(r"\b\w*(?:Error|Exception|Warning)\b|\b(?:error|warning)\b", re.I)
KNOWN = "known nondeterministic on this build"
BUCKETS = ("declaration not met", KNOWN, "a cell raised", "PyTorch's message changed",
           "other output changed", "formatting only")
# The tests that skip on a CPU build (the fork server and CUDA's initialisation, the op lock of
# torch >= 2.14): on the CUDA build they must run. A skip whose reason is CPU_BUILD_SKIP fails --ci.
CUDA_TESTS = ("tests/launching/test_cuda_init.py", "tests/instruments/test_deepspeed_ops.py")
# Tests of the new torch whatever its build, run beside them: the private torch names the course
# reads (issue 47), which a release may rename without a word.
NEW_TORCH_TESTS = ("tests/test_private_torch_names.py",)
CPU_BUILD_SKIP = "this torch is a CPU build"


def below_floor(version: str) -> str:
    """Why the course cannot run on torch `version` ("" when it can): older than its floor,
    `ddp_lab.kit.preflight.MIN_TORCH` (lesson 17's scenario 4 runs torchrun with
    `--shutdown-timeout`, an option since 2.12)."""
    from ddp_lab.kit.preflight import MIN_TORCH, _release

    if _release(version)[:2] >= MIN_TORCH:
        return ""
    floor = ".".join(map(str, MIN_TORCH))
    return (f"torch {version} is older than the course's floor, {floor}: lesson 17's elastic restart "
            f"(scenario 4) runs torchrun with --shutdown-timeout, an option since torch {floor}")


def _run(cmd, env=None, log=None, **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), env=env, cwd=REPO, text=True, **kw,
                          stdout=log, stderr=subprocess.STDOUT if log else None)


def _torch_of(python: Path) -> str:
    if not python.exists():
        return ""
    out = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def install(venv: Path, version: str, cpu: bool) -> None:
    python = venv / "bin" / "python"
    if _torch_of(python).split("+")[0] == version:
        print(f"reusing {venv} (torch {_torch_of(python)})")
        return
    _run([sys.executable, "-m", "venv", venv]).check_returncode()
    keep = [line for line in (REPO / "requirements.txt").read_text().splitlines()
            if not line.startswith(("torch==", "-e"))
            and not (line.startswith("--extra-index-url") and not cpu)]
    reqs = venv / "requirements-upgrade.txt"
    reqs.write_text("\n".join(keep) + "\n")
    pip = [python, "-m", "pip", "install", "-q"]
    index = [line for line in keep if line.startswith("--extra-index-url")]
    _run(pip + [f"torch=={version}"] + [a for line in index for a in line.split()]).check_returncode()
    _run(pip + ["-r", reqs]).check_returncode()
    _run(pip + ["--no-deps", "-e", REPO]).check_returncode()


def _env(venv: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO / "tools"))
    if venv is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(venv / "torch_extensions")
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
        env.pop("VIRTUAL_ENV", None)
    return env


def _steps(venv: Path, baseline_python: str, ci: bool) -> list:
    python = venv / "bin" / "python"
    recorder = REPO / "tools" / "upgrade_record.py"
    steps = [("build-ops", [venv / "bin" / "ddp-lab", "build-ops"], _env(venv)),
             ("tour-baseline", [baseline_python, recorder, "tour", venv / "tour-baseline.json"],
              _env(None)),
             ("tour-new", [python, recorder, "tour", venv / "tour-new.json"], _env(venv)),
             ("nbval-new", [python, "-m", "pytest", "notebooks/", "-q", "-p", "upgrade_record"],
              dict(_env(venv), DDP_LAB_UPGRADE_RECORD=str(venv / "nbval-new.json"))),
             ("cuda-tests", [python, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", *CUDA_TESTS,
                             *NEW_TORCH_TESTS], _env(venv))]
    wanted = ("build-ops", "tour-new", "cuda-tests") if ci else (
        "build-ops", "tour-baseline", "tour-new", "nbval-new")
    return [step for step in steps if step[0] in wanted]


def record(venv: Path, baseline_python: str, seconds: dict, ci: bool = False) -> dict[str, float]:
    """Build the op, run both tours and the new environment's strict nbval (with `ci`: build the
    op, run the new tour and the CUDA-build tests); seconds each."""
    for old in ("tour-baseline.json", "tour-new.json", "nbval-new.json", "cuda-tests.log"):
        (venv / old).unlink(missing_ok=True)  # a report never mixes two runs' records
    for name, cmd, env in _steps(venv, baseline_python, ci):
        start = time.time()
        with open(venv / f"{name}.log", "w") as log:
            code = _run(cmd, env=env, log=log).returncode
        seconds[name] = round(time.time() - start)
        last = (venv / f"{name}.log").read_text().strip().splitlines()[-1:] or [""]
        print(f"  {name}: exit {code} in {seconds[name]} s: {last[0][:120]}", flush=True)
    (venv / "seconds.json").write_text(json.dumps(seconds))
    return seconds


def _normalised(text: str) -> str:
    text = re.sub(r",? line \d+", "", text)
    text = re.sub(r"(\.(?:py|cpp|cc|h)):\d+", r"\1", text)
    text = re.sub(r"(?m)^\s*[\^~]+\s*$", "", text)
    return " ".join(text.split())


def _diff(old: str, new: str, limit: int = 4) -> list[str]:
    lines = [d for d in difflib.ndiff(old.splitlines(), new.splitlines()) if d[:1] in "-+"]
    shown = [f"    {d[0]} {d[2:].strip()[:150]}" for d in lines[:limit]]
    return shown + ([f"    ... {len(lines) - limit} more changed lines"] if len(lines) > limit else [])


def classify(old: str, new: str) -> str | None:
    """None when equal; else which bucket the change of `old` into `new` falls in."""
    if old == new:
        return None
    if _normalised(old) == _normalised(new):
        return "formatting only"
    changed = [d[2:] for d in difflib.ndiff(old.splitlines(), new.splitlines()) if d[:1] in "-+"]
    return ("PyTorch's message changed" if any(MESSAGE.search(line) for line in changed)
            else "other output changed")


def tour_report(base: dict, new: dict, diffs: bool = True) -> dict[str, list[str]]:
    """Each variant in its bucket: a miss of its declaration (set aside as KNOWN only where the
    declaration carries a measured rate for this torch), then, with `diffs`, how its outcome's
    text changed against the baseline."""
    found: dict[str, list[str]] = {b: [] for b in BUCKETS}
    for key, now in new["scenarios"].items():
        was = base["scenarios"].get(key, {"status": "(not in the baseline)", "headline": ""})
        if now["problems"]:
            missed = f"  {key}: " + "; ".join(now["problems"])[:400]
            if now.get("measured"):
                found[KNOWN].append(f"{missed}; the declaration {now['measured']}")
            else:
                found["declaration not met"].append(missed)
            continue
        if not diffs:
            continue
        bucket = classify(f"{was['status']}: {was['headline']}", f"{now['status']}: {now['headline']}")
        if bucket:
            found[bucket] += [f"  {key}"] + _diff(was["headline"], now["headline"])
    return found


def nbval_report(cells: list[dict]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {b: [] for b in BUCKETS}
    for cell in (c for c in cells if not c["passed"]):
        where = f"  {cell['notebook']} cell {cell['cell']}"
        if cell["why"].startswith("Cell execution caused an exception"):
            last = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", cell["traceback"]).splitlines()
                    if ln.strip()][-1:] or ["?"]
            bucket = "declaration not met" if "AssertionError" in last[0] else "a cell raised"
            found[bucket].append(f"{where}: {last[0].strip()[:300]}")
            continue
        for key in sorted(set(cell["expected"]) | set(cell["obtained"])):
            old, new = cell["expected"].get(key, ""), cell["obtained"].get(key, "")
            bucket = classify(old, new)
            if bucket:
                found[bucket] += [f"{where} ({key})"] + _diff(old, new)
    return found


def cuda_tests_report(venv: Path) -> tuple[bool, str]:
    """Whether the CUDA-build tests passed, none of them skipped as on a CPU build; their summary."""
    lines = (venv / "cuda-tests.log").read_text().strip().splitlines() or ["(no output)"]
    summary = lines[-1]
    cpu_skips = [ln for ln in lines if CPU_BUILD_SKIP in ln]
    passed = (re.search(r"\d+ passed", summary) is not None and
              not re.search(r"\d+ (failed|error)", summary) and not cpu_skips)
    return passed, summary + (f" ({len(cpu_skips)} skipped as on a CPU build)" if cpu_skips else "")


def report(venv: Path, ci: bool = False) -> int:
    needed = ("tour-new.json", "cuda-tests.log") if ci else (
        "tour-baseline.json", "tour-new.json", "nbval-new.json")
    missing = [n for n in needed if not (venv / n).is_file()]
    if missing:
        print(f"upgrade_check: no records in {venv} ({', '.join(missing)} missing): run it "
              f"without --report-only first", file=sys.stderr)
        return 2
    new = json.loads((venv / "tour-new.json").read_text())
    base = (json.loads((venv / "tour-baseline.json").read_text()) if not ci
            else {"torch": "(no baseline: --ci)", "scenarios": {}})
    cells = [] if ci else json.loads((venv / "nbval-new.json").read_text())["cells"]
    variants = new["scenarios"].values()
    declared = sum(not v["problems"] for v in variants)
    known = sum(bool(v["problems"] and v.get("measured")) for v in variants)
    failed = [c for c in cells if not c["passed"]]
    seconds = json.loads((venv / "seconds.json").read_text())
    print(f"\n== torch {new['torch']} against torch {base['torch']} (seconds: "
          + ", ".join(f"{k} {v}" for k, v in seconds.items()) + ")")
    print(f"tour: {declared}/{len(new['scenarios'])} scenario variants as declared"
          + (f", {known} more {KNOWN} (below)" if known else ""))
    tests_ok = True
    if ci:
        tests_ok, summary = cuda_tests_report(venv)
        print(f"CUDA-build tests ({', '.join(CUDA_TESTS)}) and {', '.join(NEW_TORCH_TESTS)}: "
              f"{summary}")
    else:
        print(f"strict nbval: {len(cells)} cells, {len(cells) - len(failed)} passed, "
              f"{len(failed)} failed")
    parts = [("the tour, per scenario", tour_report(base, new, diffs=not ci))]
    if not ci:
        parts.append(("strict nbval, per cell", nbval_report(cells)))
    for title, found in parts:
        print(f"\n-- {title}")
        for bucket in BUCKETS:
            lines = found[bucket]
            count = sum(not ln.startswith("    ") for ln in lines)
            print(f"{bucket}: {count or 'none'}")
            for line in lines:
                print(line)
    return 0 if declared + known == len(new["scenarios"]) and not failed and tests_ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", required=True, help="the torch version to check, e.g. 2.14.1")
    parser.add_argument("--venv", type=Path, help="its environment (default .upgrade/torch-VERSION)")
    parser.add_argument("--cpu", action="store_true", help="the CPU build (requirements.txt's index)")
    parser.add_argument("--ci", action="store_true",
                        help="CI's part: build-ops, the tour and the CUDA-build tests, no baseline")
    parser.add_argument("--report-only", action="store_true", help="report from the last records")
    args = parser.parse_args(argv)
    if below_floor(args.torch):
        parser.error(below_floor(args.torch))
    venv = (args.venv or REPO / ".upgrade" / f"torch-{args.torch}").resolve()
    if not args.report_only:
        start = time.time()
        install(venv, args.torch, args.cpu)
        record(venv, sys.executable, {"install": round(time.time() - start)}, ci=args.ci)
        print(f"recorded in {time.time() - start:.0f} s")
    return report(venv, ci=args.ci)


if __name__ == "__main__":
    sys.exit(main())
