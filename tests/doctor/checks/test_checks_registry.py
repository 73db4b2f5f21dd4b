"""The checks' one registry (ddp_lab/doctor/checks): every check module imports, defines one
`Check` whose codes have levels, and names its test file(s), which exist and test each of its
codes."""
from pathlib import Path

from ddp_lab.doctor import checks
from ddp_lab.doctor.report import LESSONS

ROOT = Path(__file__).parents[3]


def test_every_check_module_imports_and_has_the_shape():
    found = checks.registry()
    assert not checks.BROKEN, checks.BROKEN
    assert found, "no check registered"
    codes = {}
    for name, check in found.items():
        assert (ROOT / "ddp_lab" / "doctor" / "checks" / f"{name}.py").exists(), name
        assert check.lesson in LESSONS, (name, check.lesson)
        assert check.tools and check.mechanism and check.judge
        assert "watch" not in check.tools or check.attach is not None or name in ("collectives", "raised"), name
        tests = [check.tests] if isinstance(check.tests, str) else list(check.tests)
        assert tests and all(tests), f"{name}: no tests named"
        for test in tests:
            assert (ROOT / test).exists(), f"{name}: its tests ({test!r}) do not exist"
        text = "".join((ROOT / test).read_text() for test in tests)
        for code in check.codes:
            assert code in text, f"{name}: {check.tests} never names its code {code!r}"
            assert code not in codes, f"{code} is given by both {codes.get(code)} and {name}"
            codes[code] = name
