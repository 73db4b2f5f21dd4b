"""`ddp_lab.doctor` is both a package and, called, the doctor (issue 38, point 15): every
ordinary import form of its submodules works, and the calls the notebooks and the README make
still reach the function. Each form runs in a fresh interpreter: whether `import a.b.c as x`
works depends on what `ddp_lab` holds as its attribute `doctor` when the statement runs."""
import subprocess
import sys

import pytest

FORMS = {
    "import as": "import ddp_lab.doctor.sharded as s; assert s.__name__ == 'ddp_lab.doctor.sharded'",
    "import": "import ddp_lab.doctor.sharded; assert ddp_lab.doctor.sharded.sharded_findings",
    "from import": "from ddp_lab.doctor import sharded; assert sharded.sharded_findings",
    "watch, import as": "import ddp_lab.doctor.watch.rank as r; assert r.__name__ == 'ddp_lab.doctor.watch.rank'",
    "watch after ddp_lab.watch": "import ddp_lab; ddp_lab.watch; import ddp_lab.doctor.watch.checks as c",
    "the package": "import ddp_lab.doctor as d; from ddp_lab import doctor; assert d is doctor and d.Report",
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
