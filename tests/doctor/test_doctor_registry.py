"""Registry acceptance: every scenario whose bug lives in the module (`scenario.module`, a
ModuleCase) is flagged by the doctor -- its broken module with an error or warning of the
scenario's lesson, its fixed module with no error at all. New lessons are picked up as they
are added to ddp_lab/lessons/."""
import pytest

import ddp_lab
from ddp_lab.doctor import doctor
from ddp_lab.course.registry import lessons

CASES = [s for lesson in lessons().values() for s in lesson.scenarios if s.module is not None]
TIMEOUT = 20  # a module that hangs is reported after this many seconds


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


def test_the_registry_declares_module_cases():
    assert len(CASES) >= 3, "no ModuleCase in the registry: the doctor's acceptance has nothing to run"


@pytest.mark.parametrize("scenario", CASES, ids=[s.key for s in CASES])
def test_broken_module_is_flagged_with_the_scenarios_lesson(scenario):
    case = scenario.module
    report = doctor(case.broken, case.input, amp=case.amp, timeout=TIMEOUT,
                    strategy=case.strategy, compile=case.compile)
    flagged = [f for f in report.findings if f.severity in ("error", "warning")]
    assert scenario.lesson in {f.lesson for f in flagged}, (
        f"{scenario.key}: no error or warning of lesson {scenario.lesson}:\n{report}")


@pytest.mark.parametrize("scenario", CASES, ids=[s.key for s in CASES])
def test_fixed_module_has_no_error(scenario):
    case = scenario.module
    report = doctor(case.fixed, case.input, amp=case.amp, timeout=TIMEOUT,
                    strategy=case.strategy, compile=case.compile)
    assert report.errors == [], f"{scenario.key} fixed:\n{report}"
