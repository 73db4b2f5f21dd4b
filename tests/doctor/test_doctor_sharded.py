"""The doctor's `strategy` option (doctor/exam/sharded.py): a tie registered in two FSDP2 units,
frozen and trainable parameters in one unit, bad input. The lesson-12 ModuleCases (a weight
read by a second unit, a norm read outside its unit) are checked by test_doctor_registry."""
import argparse

import pytest
import torch
from torch import nn

from ddp_lab.doctor import DoctorInputError, doctor
from ddp_lab.doctor.cli import configure
from ddp_lab.lessons.l12_sharded_modules import RegisteredTie, tokens


class HalfFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        block = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        block[0].requires_grad_(False)
        self.block = block

    def forward(self, x):
        return self.block(x)


def test_registered_tie_is_named_with_pytorchs_message():
    report = doctor(RegisteredTie, tokens, strategy="fsdp2", timeout=60)
    [f] = [f for f in report.errors if f.code == "weight-shared-across-units"]
    assert f.lesson == "12"
    assert "out.weight: units emb, out" in f.evidence
    assert any("is shared with a parameter already managed by another FSDP group" in e
               for e in f.evidence)


def test_mixed_requires_grad_in_one_unit_is_only_noted():
    """Lesson 12 measures that FSDP2 handles it (frozen_part_in_unit): a note, no warning."""
    report = doctor(HalfFrozen, torch.randn(4, 8), strategy="fsdp2", timeout=60)
    assert [(f.code, f.severity) for f in report.findings if f.lesson == "12"] == [
        ("mixed-requires-grad", "info")]
    assert report.errors == []


def test_unknown_strategy_is_refused_before_any_launch():
    with pytest.raises(DoctorInputError, match="strategy must be one of ddp, fsdp2, zero3"):
        doctor(RegisteredTie, tokens, strategy="zero2")


def test_cli_takes_strategy():
    args = configure(argparse.ArgumentParser()).parse_args(
        ["m.py:Net", "--input", "torch.randn(2, 8)", "--strategy", "zero3"])
    assert args.strategy == "zero3"
    with pytest.raises(SystemExit):
        configure(argparse.ArgumentParser()).parse_args(
            ["m.py:Net", "--input", "x", "--strategy", "fsdp1"])
