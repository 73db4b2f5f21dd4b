"""The doctor on its corpus (tests/corpus/doctor/*/: broken.py, fixed.py, case.toml), scored by
tools/corpus_score.py: each broken version caught by one of its case's codes at error or warning
level, each fixed version with no error- or warning-level finding, and the fault line named by
a catching finding's `where` in at least 80 % of the cases (issue 36's acceptance)."""
import os
from functools import lru_cache

import pytest

from conftest import corpus_score

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "doctor")
NAMED_SHARE = 0.8


score = corpus_score()
CASES = {c.name: c for c in score.cases("doctor")}


@lru_cache(maxsize=None)
def scored(name: str):
    return score.score(CASES[name])


def test_every_case_folder_is_complete_and_cited():
    for name in sorted(os.listdir(FOLDER)):
        folder = os.path.join(FOLDER, name)
        if not os.path.isdir(folder) or name.startswith(("_", ".")):
            continue
        for part in ("broken.py", "fixed.py", "case.toml"):
            assert os.path.isfile(os.path.join(folder, part)), f"{name} has no {part}"
    for case in CASES.values():
        assert case.spec["cites"] and all(c.startswith("https://") for c in case.spec["cites"])
        assert case.spec["codes"] and case.mechanism
        case.fault_line()  # raises unless `fault` is on exactly one line of broken.py


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_is_caught_and_fixed_is_clean(name):
    s = scored(name)
    assert s.caught, f"{name}: none of {CASES[name].spec['codes']} at error/warning; got {s.seen}"
    assert not s.false_alarms, f"{name}: the fixed version has {s.false_alarms}"


def test_the_fault_line_is_named_in_most_cases():
    named = [n for n in sorted(CASES) if scored(n).named]
    assert len(named) >= NAMED_SHARE * len(CASES), (
        f"the fault line is named in {len(named)} of {len(CASES)} cases: "
        f"{sorted(set(CASES) - set(named))} miss it")


def test_the_table_counts_what_was_scored():
    table = score.table([scored(n) for n in sorted(CASES)])
    last = table.splitlines()[-1]
    caught = sum(scored(n).caught for n in CASES)
    assert last.startswith(f"| all | {len(CASES)} | {caught} |")
