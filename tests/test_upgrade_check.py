"""tools/upgrade_check.py without installing another torch (that takes minutes and gigabytes:
the README's "Running the course on a new PyTorch" quotes a real run): its report from records,
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
