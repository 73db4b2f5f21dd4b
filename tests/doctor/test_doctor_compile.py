"""The doctor's compile check (doctor/compiled.py: `compile=True`, `--compile`) beyond lesson 15's
ModuleCases (a Python counter, a side effect in a checkpoint: test_doctor_registry checks them):
a graph break from a branch on a tensor's value, ranks that compile different graphs because
their sequence lengths differ, a DDP setting that fails only under compile, and the CLI flag."""
from __future__ import annotations

import argparse
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddp_lab.doctor import doctor
from ddp_lab.doctor.cli import configure
from ddp_lab.lessons import l15_compile as l15

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture(scope="module", autouse=True)
def warm_compiler():
    l15.prepare()


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
    [f] = [f for f in report.findings if f.code == "ranks-compile-different-graphs"]
    assert f.lesson == "15" and f.severity == "warning"
    line = line_of(MergesPairs, "F.pad(")
    expected = f"test_doctor_compile.py:{line} in forward: x = F.pad("
    assert any(expected in e for e in f.evidence), f.evidence
    assert report.errors == []


def test_a_branch_on_a_tensor_value_is_a_graph_break_at_its_line():
    report = doctor(ClipsLarge, torch.randn(8, 16), compile=True, timeout=60)
    [f] = [f for f in report.findings if f.code == "graph-break-in-module"]
    line = line_of(ClipsLarge, "if h.abs().max() > 100")
    assert any(f"test_doctor_compile.py:{line} in forward: if h.abs().max() > 100:" in e
               for e in f.evidence), f.evidence
    assert "recompiles" not in " ".join(report.codes())  # same batch, nothing to recompile


def test_a_bucket_smaller_than_ddps_first_fails_only_under_compile():
    """DDPOptimizer asserts that DDP's first bucket (1 MiB) is no larger than the others
    (torch/_dynamo/backends/distributed.py, DDPOptimizer.__init__); eager DDP accepts it."""
    report = doctor(Small, torch.randn(8, 16), ddp_kwargs={"bucket_cap_mb": 0.5}, compile=True,
                    timeout=60)
    [f] = report.errors
    assert f.code == "fails-under-compile" and f.lesson == "15"
    assert "AssertionError" in f.title and "First bucket should be smaller/equal" in f.evidence[0]


def test_without_compile_nothing_is_compiled_or_reported():
    report = doctor(l15.warmup_net, l15.features, timeout=60)
    assert "15" not in {f.lesson for f in report.findings}
    assert not any(n.startswith("compile:") for n in report.notes)


def test_cli_takes_compile():
    parse = configure(argparse.ArgumentParser()).parse_args
    assert parse(["m.py:Net", "--input", "torch.randn(2, 8)", "--compile"]).compile is True
    assert parse(["m.py:Net", "--input", "torch.randn(2, 8)"]).compile is False
