"""The registry's check compiled for the doctor (ddp_lab/doctor/checks/compiled.py, _compiled_module.py): the doctor
compiles as the user compiles. Each code on a module that has the bug (the doctor corpus's broken
cases, tests/corpus/doctor/1*) and on its fix (no error or warning from this check): the error
fullgraph=True gives, with the line at fault in Finding.where (the hook's registration, not
forward's call), and the recompiles dynamic=False gives. Then on modules written
here: graph-break, ranks-compile-differently, fails-under-compile and
recompiles-after-first-step."""
from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.doctor import doctor
from ddp_lab.doctor.checks.api import Check
from ddp_lab.doctor.checks.compiled import CHECK
from ddp_lab.doctor.loader import eval_input, load_target
from conftest import corpus_score

pytestmark = pytest.mark.usefixtures("no_leftovers")
CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "doctor"


def run_case(slug: str, which: str):
    """The doctor on tests/corpus/doctor/<slug>/<which>.py as the corpus declares it; the case's
    declaration and the line number of its fault in broken.py."""
    folder = CORPUS / slug
    case = tomllib.loads((folder / "case.toml").read_text())
    report = corpus_score().doctor_report(str(folder / f"{which}.py"))  # the corpus test's run
    lines = (folder / "broken.py").read_text().splitlines()
    fault = next(i for i, ln in enumerate(lines, 1) if case["fault"] in ln)
    return report, case, fault


def ours(report, severities=("error", "warning")):
    return [f for f in report.findings if f.code in CHECK.codes and f.severity in severities]


def test_the_check_is_one_registry_entry_for_the_doctor_and_watch():
    assert isinstance(CHECK, Check) and CHECK.name == "compiled"
    assert CHECK.tools == ("watch", "doctor") and CHECK.lesson == "15"
    assert CHECK.codes["fullgraph-failed"] == "error"
    assert Path(__file__).name in [Path(t).name for t in CHECK.tests]


def test_fullgraph_and_a_module_backward_hook_is_an_error_at_the_registration():
    report, case, fault = run_case("10_fullgraph_backward_hook", "broken")
    [f] = [f for f in report.errors if f.code == "fullgraph-failed"]
    assert f.lesson == "15"
    assert "Module-level backwards hooks require compiled autograd" in f.title
    assert f.where == f"broken.py:{fault}: {case['fault']}", f.where  # not forward's call
    assert any("dynamo stopped at broken.py:" in e and "self.head(x)" in e for e in f.evidence)
    assert any(e.startswith("PyTorch's hint:") and "compiled_autograd" in e for e in f.evidence)


def test_without_fullgraph_the_hook_is_a_graph_break_named_at_its_registration():
    folder = CORPUS / "10_fullgraph_backward_hook"
    model, _ = load_target(f"{folder / 'broken.py'}:Net")
    report = doctor(model, torch.randn(4, 16), compile=True, timeout=60)
    [f] = [f for f in report.warnings if f.code == "graph-break"]
    line = next(i for i, ln in enumerate((folder / "broken.py").read_text().splitlines(), 1)
                if "self.register_full_backward_hook(log_grad)" in ln)
    assert f.where == f"broken.py:{line}: self.register_full_backward_hook(log_grad)", f.where
    assert "register_post_accumulate_grad_hook" in f.fix


def test_a_hook_on_the_weight_instead_compiles_in_one_graph():
    report, _, _ = run_case("10_fullgraph_backward_hook", "fixed")
    assert ours(report) == [], [f.code for f in ours(report)]
    assert any("fullgraph=True" in n and "Not exercised" in n for n in report.notes)


@pytest.mark.parametrize("slug", ["11_fullgraph_item_branch", "12_fullgraph_print_in_forward"])
def test_fullgraph_fails_at_the_line_dynamo_cannot_trace(slug):
    report, case, fault = run_case(slug, "broken")
    [f] = [f for f in report.errors if f.code == "fullgraph-failed"]
    assert f.where == f"broken.py:{fault}: {case['fault']}", f.where
    assert f.evidence[0].startswith("PyTorch (")


@pytest.mark.parametrize("slug", ["11_fullgraph_item_branch", "12_fullgraph_print_in_forward"])
def test_the_traceable_forward_passes_fullgraph(slug):
    report, _, _ = run_case(slug, "fixed")
    assert ours(report) == [], [(f.code, f.evidence) for f in ours(report)]


def test_a_python_counter_under_dynamic_false_recompiles_every_step_at_its_line():
    report, case, fault = run_case("13_recompiles_counter_dynamic_false", "broken")
    [f] = [f for f in report.warnings if f.code == "recompiles-every-step"]
    assert f.where == f"broken.py:{fault}: {case['fault']}", f.where
    assert any(e.startswith("dynamic=False") for e in f.evidence)


def test_a_buffer_counter_does_not_recompile():
    report, _, _ = run_case("13_recompiles_counter_dynamic_false", "fixed")
    assert ours(report) == [], [f.code for f in ours(report)]


def line_of(cls, text: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, ln in enumerate(lines) if text in ln)


class MergesPairs(nn.Module):
    """Merges neighbouring positions in pairs, padding an odd length first (as patch merging
    does): a rank whose sequences have an odd length runs one op more."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):  # (batch, time, 16)
        if x.shape[1] % 2:
            x = F.pad(x, (0, 0, 0, 1))
        return self.lin(x.unflatten(1, (-1, 2)).mean(2))


class ClipsLarge(nn.Module):
    """Rescales activations only when they grow large, decided in Python on a tensor's value."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        if h.abs().max() > 100:
            h = h / h.abs().max()
        return h


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_ranks_with_another_length_compile_another_graph_named_by_its_line():
    report = doctor(MergesPairs, torch.randn(4, 12, 16), compile=True, timeout=60)
    [f] = [f for f in report.findings if f.code == "ranks-compile-differently"]
    assert f.lesson == "15" and f.severity == "warning"
    line = line_of(MergesPairs, "F.pad(")
    expected = f"test_compiled_doctor.py:{line} in forward: x = F.pad("
    assert any(expected in e for e in f.evidence), f.evidence
    assert f.where.startswith(f"test_compiled_doctor.py:{line}: x = F.pad("), f.where
    assert report.errors == []


def test_a_branch_on_a_tensor_value_is_a_graph_break_at_its_line():
    report = doctor(ClipsLarge, torch.randn(8, 16), compile=True, timeout=60)
    [f] = [f for f in report.findings if f.code == "graph-break"]
    line = line_of(ClipsLarge, "if h.abs().max() > 100")
    assert any(f"test_compiled_doctor.py:{line} in forward: if h.abs().max() > 100:" in e
               for e in f.evidence), f.evidence
    assert "recompiles" not in " ".join(report.codes())  # same batch, nothing to recompile
    assert f.where == f"test_compiled_doctor.py:{line}: if h.abs().max() > 100:", f.where


def test_a_bucket_smaller_than_ddps_first_fails_only_under_compile():
    """DDPOptimizer asserts that DDP's first bucket (1 MiB) is no larger than the others
    (torch/_dynamo/backends/distributed.py, DDPOptimizer.__init__); eager DDP accepts it."""
    report = doctor(Small, torch.randn(8, 16), ddp_kwargs={"bucket_cap_mb": 0.5}, compile=True,
                    timeout=60)
    [f] = report.errors
    assert f.code == "fails-under-compile" and f.lesson == "15"
    assert "AssertionError" in f.title and "First bucket should be smaller/equal" in f.evidence[0]


class StartsOnce(nn.Module):
    """Scales its first output once (a warm start), remembered in a Python bool."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.started = False

    def forward(self, x):
        h = self.lin(x)
        if not self.started:
            self.started = True
            return h * 0.5
        return h


def test_state_that_changes_once_recompiles_after_the_first_step_only():
    report = doctor(StartsOnce, torch.randn(8, 16), compile=True, timeout=60)
    [f] = [f for f in report.warnings if f.code == "recompiles-after-first-step"]
    assert any("guard that failed" in e and "started" in e for e in f.evidence), f.evidence
    assert "recompiles-every-step" not in report.codes()


def test_a_module_without_python_state_compiles_once():
    report = doctor(Small, torch.randn(8, 16), compile=True, timeout=60)
    assert ours(report, ("error", "warning", "info")) == []
