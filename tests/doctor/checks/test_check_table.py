"""The docs' tables of checks (docs/watch.md, docs/doctor.md) are written from the registry by
tools/check_table.py: the committed ones are up to date, and a check that declares several
mechanisms (issue 43's shape) gets one row each, with its own codes and notes."""
import importlib.util
from pathlib import Path

from ddp_lab.doctor.checks.api import Check

TOOL = Path(__file__).resolve().parents[3] / "tools" / "check_table.py"
spec = importlib.util.spec_from_file_location("check_table", TOOL)
check_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_table)


def test_the_committed_tables_are_the_registrys():
    for tool, path in check_table.DOCS.items():
        text = path.read_text()
        assert check_table.rewritten(text, tool) == text, f"{path.name} is stale: run tools/check_table.py"


def test_one_row_per_mechanism_with_its_codes_and_notes():
    judge = lambda ev: []  # noqa: E731
    one = Check(name="one", mechanism="a thing", lesson="07", codes={"a-code": "warning"},
                judge=judge, attach=judge, notes=("not b",))
    two = Check(name="two", mechanism=({"what": "first", "codes": {"x": "error"}, "notes": ("n1",)},
                                       {"what": "second", "codes": {"y": "info"}}),
                lesson="13", codes={"x": "error", "y": "info"}, judge=judge, attach=judge)
    rows = check_table.rows("watch", {"one": one, "two": two})
    assert rows == ["| one | a thing | `a-code` (warning) | 07 | not b |",
                    "| two | first | `x` (error) | 13 | n1 |",
                    "| two | second | `y` (info) | 13 | - |"]
    assert check_table.rows("doctor", {"one": one}) == []
