"""`ddp-lab check`: the attendees' pre-flight check."""
import sys

from ddp_lab.kit import preflight
from ddp_lab.cli import main


def test_check_passes_here_with_one_line_per_check(capsys):
    assert main(["check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split()[1] for l in lines[:-1]] == ["python", "torch", "two", "jupyterlab", "ipywidgets", "kernel"]
    assert all(l.startswith("ok") for l in lines[:-1]) and lines[-1].startswith("all checks passed")
    assert "all_reduce gave 3.0 on both, in" in lines[2]


def test_a_failing_check_fails_the_whole_check_and_says_the_fix():
    printed = []
    rc = preflight.preflight([preflight.python_version, lambda: preflight.Item("thing", False, "missing", "install it")],
                              out=printed.append)
    assert rc == 1
    assert printed[1] == "FAIL  thing        missing\n      fix: install it"
    assert printed[-1] == "1 check(s) failed"


def test_a_kernel_that_cannot_import_the_course_is_named(monkeypatch):
    monkeypatch.setattr(preflight, "kernel_python", lambda: ("Python 3 (ipykernel)", sys.executable))
    monkeypatch.setattr(preflight, "KERNEL_IMPORTS", ("json", "no_such_module_ddp_lab_test"))
    result = preflight.notebook_kernel()
    assert not result.ok
    assert result.detail.endswith("lacks: no_such_module_ddp_lab_test") and "pip install" in result.fix


def test_torch_release_parsing():
    assert preflight._release("2.13.0+cpu") == (2, 13, 0)
    assert preflight._release("2.4.0a0+git123") == (2, 4, 0)
