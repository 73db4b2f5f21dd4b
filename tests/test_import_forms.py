"""`ddp_lab.doctor` is both a package and, called, the doctor (issue 38, point 15): every
ordinary import form of its submodules works, and the calls the notebooks and the README make
still reach the function. Each form runs in a fresh interpreter: whether `import a.b.c as x`
works depends on what `ddp_lab` holds as its attribute `doctor` when the statement runs."""
import subprocess
import sys

import pytest

import ddp_lab.doctor as package
from ddp_lab.doctor.exam import sharded
from ddp_lab.doctor.watch import function_checks as checks, rank

SHARDED, RANK, CHECKS, PACKAGE = sharded.__name__, rank.__name__, checks.__name__, package.__name__
TOP = PACKAGE.split(".")[0]
FORMS = {  # written from the modules' names (tests/test_paths_of_ours.py)
    "import as": f"import {SHARDED} as s; assert s.__name__ == {SHARDED!r}",
    "import": f"import {SHARDED}; assert {SHARDED}.phase",
    "from import": f"from {SHARDED.rpartition('.')[0]} import sharded; assert sharded.phase",
    "watch, import as": f"import {RANK} as r; assert r.__name__ == {RANK!r}",
    "watch after the top's watch": f"import {TOP}; {TOP}.watch; import {CHECKS} as c",
    "the package": f"import {PACKAGE} as d; from {TOP} import doctor; assert d is doctor and d.Report",
}


@pytest.mark.parametrize("code", FORMS.values(), ids=FORMS.keys())
def test_an_import_form_works_in_a_fresh_interpreter(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_calling_the_package_calls_the_doctor():
    import inspect

    import ddp_lab
    from ddp_lab import doctor
    from ddp_lab.doctor import DoctorInputError
    from ddp_lab.doctor import doctor as function

    assert inspect.isfunction(function) and ddp_lab.doctor is doctor and doctor.doctor is function
    assert inspect.signature(doctor) == inspect.signature(function)
    # bad arguments: the function's own check answers, before anything is launched
    with pytest.raises(DoctorInputError, match="world_size must be an integer >= 1"):
        doctor(object, None, world_size=0)
    with pytest.raises(DoctorInputError, match="steps must be an integer >= 1"):
        ddp_lab.doctor(object, None, steps=0)
