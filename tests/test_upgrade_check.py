"""tools/upgrade_check.py without installing another torch (that takes minutes and gigabytes:
docs/upgrading.md, "Running the course on a new PyTorch", quotes a real run): its report from records,
and its refusal when there are none."""
import json
import subprocess
import sys

from conftest import REPO

TOOL = REPO / "tools" / "upgrade_check.py"


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), "--torch", "9.9", *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_report_only_without_records_says_what_is_missing(tmp_path):
    out = _run("--report-only", "--venv", str(tmp_path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "no records in" in out.stderr and "tour-baseline.json" in out.stderr


def test_the_report_sorts_a_changed_message_from_a_declaration(tmp_path):
    scenario = {"status": "ok", "problems": [], "headlines": ["ok"]}
    tour = {"torch": "2.13.0+cpu", "scenarios": {"00/x broken": scenario}}
    (tmp_path / "tour-baseline.json").write_text(json.dumps(tour))
    (tmp_path / "tour-new.json").write_text(json.dumps(
        {"torch": "9.9", "scenarios": {"00/x broken": {**scenario, "problems": ["status 'error'"]}}}))
    (tmp_path / "nbval-new.json").write_text(json.dumps({"cells": []}))
    (tmp_path / "seconds.json").write_text("{}")
    out = _run("--report-only", "--venv", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "0/1 scenario variants as declared" in out.stdout, out.stdout


def _records(tmp_path, new_variant, *, ci=False, cuda_log=""):
    scenario = {"status": "ok", "problems": [], "headline": "ok", "measured": None}
    (tmp_path / "tour-new.json").write_text(json.dumps(
        {"torch": "9.9", "scenarios": {"00/x broken": {**scenario, **new_variant}}}))
    if ci:
        (tmp_path / "cuda-tests.log").write_text(cuda_log)
    else:
        (tmp_path / "tour-baseline.json").write_text(json.dumps(
            {"torch": "2.13.0+cpu", "scenarios": {"00/x broken": scenario}}))
        (tmp_path / "nbval-new.json").write_text(json.dumps({"cells": []}))
    (tmp_path / "seconds.json").write_text("{}")
    return _run("--report-only", "--venv", str(tmp_path), *(["--ci"] if ci else []))


MISSED = {"status": "ok", "problems": ["status 'ok', expected 'crashed'"]}
RATE = "holds in 47 of 50 runs on torch 9.9 (python tools/measure_rate.py 00/x broken)"


def test_a_miss_with_a_measured_rate_is_set_aside_and_does_not_fail(tmp_path):
    out = _records(tmp_path, {**MISSED, "measured": RATE})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 more known nondeterministic on this build" in out.stdout, out.stdout
    assert "known nondeterministic on this build: 1" in out.stdout and RATE in out.stdout


def test_the_bucket_is_refused_to_a_miss_without_a_measured_rate(tmp_path):
    out = _records(tmp_path, {**MISSED, "measured": None})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "declaration not met: 1" in out.stdout and "known nondeterministic on this build: none" in out.stdout


def test_ci_mode_needs_the_cuda_build_tests_to_run_not_skip(tmp_path):
    ran = "5 passed, 2 skipped in 21.0s"
    assert _records(tmp_path, {}, ci=True, cuda_log=ran).returncode == 0
    skipped = ("SKIPPED [3] tests/launching/test_cuda_init.py:81: this torch is a CPU build: ...\n"
               "2 passed, 3 skipped in 9.0s")
    out = _records(tmp_path, {}, ci=True, cuda_log=skipped)
    assert out.returncode == 1 and "skipped as on a CPU build" in out.stdout, out.stdout
    assert _records(tmp_path, {}, ci=True, cuda_log="1 failed, 4 passed in 9.0s").returncode == 1


def test_ci_runs_the_newest_torch_after_the_pinned_suite():
    # issue 34 (issue 26's decision): after the pinned build's suite, the CUDA build's part
    ci = (REPO / ".ci" / "run").read_text()
    check = ".venv/bin/python tools/upgrade_check.py --torch 2.14.1 --ci"
    assert check in ci and ci.index(".venv/bin/python -m pytest") < ci.index(check)


def test_a_torch_below_the_floor_is_refused_before_anything_is_installed(tmp_path):
    """Lesson 17's scenario 4 gives torchrun --shutdown-timeout (torch >= 2.12): the floor."""
    out = subprocess.run([sys.executable, str(TOOL), "--torch", "2.11.0", "--venv", str(tmp_path / "v")],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "older than the course's floor, 2.12" in out.stderr and "--shutdown-timeout" in out.stderr
    assert not (tmp_path / "v").exists()


def test_the_floor_is_one_figure_and_lesson_17_says_it_where_it_teaches_it():
    import tomllib

    import nbformat

    from ddp_lab.kit.preflight import MIN_TORCH

    floor = ".".join(map(str, MIN_TORCH))
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch>={floor}" in deps
    nb = nbformat.read(REPO / "notebooks" / "17_start_restart_resume.ipynb", as_version=4)
    section = next(c.source for c in nb.cells if c.source.startswith("## 4 · An elastic restart"))
    assert "--shutdown-timeout" in section and f"torch {floor}" in section
    import torch.distributed.run as run

    assert "--shutdown-timeout" in run.get_args_parser().format_help()  # this torch has it
