"""watch on its corpus (tests/corpus/watch/*/: broken.py, fixed.py, case.toml: ordinary torchrun
scripts, each pair modelled on a public report it cites), scored by tools/corpus_score.py as
`ddp-lab watch broken.py` runs them: every fixed script without an error- or warning-level
finding; each broken one caught by one of its case's codes at error or warning level (a case
watch is known to miss says so in case.toml, `missed = "why"`, and its test fails the day it is
caught); at least 90 % caught and the fault line named in at least 80 % (issue 35's acceptance)."""
import os
from functools import lru_cache

import pytest

from conftest import corpus_score

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "watch")
CAUGHT_SHARE, NAMED_SHARE = 0.9, 0.8


score = corpus_score()
CASES = {c.name: c for c in score.cases("watch")}


@lru_cache(maxsize=None)
def scored(name: str):
    return score.score(CASES[name])


def test_every_case_folder_is_complete_and_cited():
    assert len(CASES) >= 30, f"the corpus holds {len(CASES)} cases; issue 35 asks for 30"
    for name in sorted(os.listdir(FOLDER)):
        folder = os.path.join(FOLDER, name)
        if not os.path.isdir(folder) or name.startswith(("_", ".")):
            continue
        for part in ("broken.py", "fixed.py", "case.toml"):
            assert os.path.isfile(os.path.join(folder, part)), f"{name} has no {part}"
    from ddp_lab.doctor.checks import registry
    for case in CASES.values():
        assert case.spec["cites"] and all(c.startswith("https://") for c in case.spec["cites"])
        assert case.mechanism in registry(), f"{case.name}: no check named {case.mechanism!r}"
        assert set(case.spec["codes"]) <= set(registry()[case.mechanism].codes), case.name
        case.fault_line()  # raises unless `fault` is on exactly one line of broken.py


def _marks(name):
    why = CASES[name].spec.get("missed")
    return [pytest.mark.xfail(reason=why, strict=True)] if why else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in sorted(CASES)])
def test_broken_is_caught(name):
    s = scored(name)
    assert s.caught, f"{name}: none of {CASES[name].spec['codes']} at error/warning; got {s.seen}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_has_no_error_or_warning(name):
    assert not scored(name).false_alarms, f"{name}: the fixed script has {scored(name).false_alarms}"


def test_most_are_caught_with_the_line_at_fault():
    caught = [n for n in sorted(CASES) if scored(n).caught]
    named = [n for n in caught if scored(n).named]
    assert len(caught) >= CAUGHT_SHARE * len(CASES), f"caught {len(caught)} of {len(CASES)}"
    assert len(named) >= NAMED_SHARE * len(CASES), (
        f"the fault line is named in {len(named)} of {len(CASES)} cases: "
        f"{sorted(set(CASES) - set(named))} miss it")
