"""The doctor's compile settings (doctor/exam/compile_run.py: `compile=True`, `compile={...}`,
`--compile` and `--compile-*`): what the user's settings become, the note that says how the doctor
compiled and what it did not exercise, and the CLI flags. The findings themselves are the registry
check's: tests/doctor/checks/test_compiled_doctor.py."""
from __future__ import annotations

import argparse

import pytest
import torch._inductor.config as inductor_config

from ddp_lab.doctor import DoctorInputError, doctor
from ddp_lab.doctor.cli import _compile, configure
from ddp_lab.doctor.exam.compile_run import cpp_compiler, note, settings_of
from ddp_lab.lessons import l15_compile as l15

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_without_compile_nothing_is_compiled_or_reported():
    report = doctor(l15.warmup_net, l15.features, timeout=60)
    assert "15" not in {f.lesson for f in report.findings}
    assert not any(n.startswith("compile:") for n in report.notes)


def test_cli_takes_compile_and_the_users_settings():
    parse = configure(argparse.ArgumentParser()).parse_args
    base = ["m.py:Net", "--input", "torch.randn(2, 8)"]
    assert _compile(parse(base + ["--compile"])) is True
    assert _compile(parse(base)) is False
    args = parse(base + ["--compile-fullgraph", "--compile-dynamic", "false",
                         "--compile-backend", "aot_eager"])
    assert _compile(args) == {"fullgraph": True, "dynamic": False, "backend": "aot_eager"}
    assert _compile(parse(base + ["--compile-mode", "max-autotune"])) == {"mode": "max-autotune"}


def test_true_is_the_doctors_own_aot_eager_and_a_dict_is_the_users_settings():
    assert settings_of(True)["run"] == "aot_eager" and settings_of(False) is None
    given = settings_of({"fullgraph": True, "dynamic": False, "backend": "aot_eager"})
    assert (given["fullgraph"], given["dynamic"], given["run"]) == (True, False, "aot_eager")
    assert settings_of({})["backend"] == "inductor"  # torch.compile's default backend


@pytest.mark.parametrize("bad", [{"fullgrph": True}, {"dynamic": "yes"}, {"backend": len}, "inductor"])
def test_settings_torch_compile_would_not_take_are_bad_input(bad):
    with pytest.raises(DoctorInputError, match="compile"):
        doctor(l15.warmup_net, l15.features, compile=bad)


def test_inductor_without_a_cpp_compiler_runs_aot_eager_and_says_so():
    """torch/_inductor/cpp_builder.py:83 cpp_compiler_search tries config.cpp.cxx (None: conda's
    g++ only when TORCH_INDUCTOR_INSTALL_GXX is set) and raises InvalidCxxCompiler."""
    with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
        assert cpp_compiler() == ""
        settings = settings_of({"backend": "inductor", "mode": "max-autotune"})
    assert settings["run"] == "aot_eager"
    text = note(settings, 3)
    assert "run on backend aot_eager instead of your inductor (no C++ compiler" in text
    assert "mode='max-autotune'" in text and "Not exercised" in text


def test_the_note_says_how_it_wrapped_and_what_one_batch_shape_cannot_show():
    full = note(settings_of({"fullgraph": True, "backend": "aot_eager"}), 3)
    assert "DDP(torch.compile(model)) with fullgraph=True" in full
    assert "torch.compile(DDP(model))" in note(settings_of(True), 3)
    assert "the same batch at each of the 3 steps" in full and "ddp-lab watch" in full
