"""Findings judged by the strategy the user trains with (doctor/strategies.py, issue 24): a rule
only DDP enforces is not an error under FSDP2 or ZeRO-3, and every finding says whose rule it is."""
import pytest
import torch
from torch import nn

from ddp_lab.doctor import Finding, Report, doctor
from ddp_lab.doctor.strategies import EVERY, STRATEGIES_OF, judged_under
from ddp_lab.instruments.deepspeed_ops import is_built


class DetachedAux(nn.Module):
    """An auxiliary head whose output is detached: legitimate, and it trains under FSDP2."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.aux = nn.Linear(8, 8)

    def forward(self, x):
        return self.body(x) + self.aux(x).detach()


def test_unused_parameters_are_an_error_under_ddp_and_a_ddp_note_under_fsdp2():
    ddp = doctor(DetachedAux, torch.randn(4, 8), timeout=60)
    assert "unused-parameters" in {f.code for f in ddp.errors}
    fsdp2 = doctor(DetachedAux, torch.randn(4, 8), strategy="fsdp2", timeout=60)
    assert fsdp2.errors == [], fsdp2.text()
    [f] = [f for f in fsdp2.findings if f.code == "unused-parameters"]
    assert f.severity == "info" and f.strategies == ("ddp",)
    assert any(e.startswith("DDP only: under fsdp2 this is not an error") for e in f.evidence)
    assert "unused-parameters: " in fsdp2.text() and "(DDP only)" in fsdp2.text()
    assert all(d["strategies"] for d in fsdp2.to_dict()["findings"])
    assert fsdp2.to_dict()["strategy"] == "fsdp2"


@pytest.mark.skipif(not is_built(), reason="DeepSpeed's op is not built here: run ddp-lab build-ops")
def test_the_detached_head_trains_sharded_by_zero3_and_is_no_error_there():
    report = doctor(DetachedAux, torch.randn(4, 8), strategy="zero3", timeout=90)
    assert report.errors == [] and report.status == "ok", report.text()
    assert [f.severity for f in report.findings if f.code == "unused-parameters"] == ["info"]


def test_under_zero3_and_fsdp2_no_ddp_only_finding_is_an_error():
    for strategy in ("fsdp2", "zero3"):
        found = judged_under([Finding("error", code, "01", "t") for code, s in STRATEGIES_OF.items()
                              if s == ("ddp",)] + [Finding("error", "hang", "03", "t")], strategy)
        assert [f.code for f in found if f.severity == "error"] == ["hang"]
    under_ddp = judged_under([Finding("error", "unused-parameters", "01", "t")], "ddp")
    assert under_ddp[0].severity == "error"


def test_an_error_only_ddps_buffer_broadcast_raised_is_its_own_severity_under_sharding():
    def shaped():
        return Finding("error", "state-shape-follows-input", "08", "t",
                       ["cache: rank 0: (6,), rank 1: (5,)", "the run then failed: rank 0 ..."])

    for strategy in ("fsdp2", "zero3"):
        [f] = judged_under([shaped()], strategy)
        assert f.severity == "warning" and f.evidence[-1].startswith(
            f"DDP only: under {strategy} this is a warning (the failure was DDP's broadcast")
    assert judged_under([shaped()], "ddp")[0].severity == "error"


def test_every_finding_states_its_strategies_in_text_html_and_dict():
    report = Report("Net", 2, 3, findings=[Finding("error", "read-outside-its-unit", "12", "t"),
                                           Finding("warning", "hard-coded-device", "02", "t")])
    assert [f.strategies for f in report.findings] == [("fsdp2", "zero3"), EVERY]
    assert [d["strategies"] for d in report.to_dict()["findings"]] == [
        ["fsdp2", "zero3"], list(EVERY)]
    assert "read-outside-its-unit: t (FSDP2, ZeRO-3)" in report.text()
    assert "hard-coded-device: t\n" in report.text() + "\n"  # every strategy: nothing added
    assert "<small>FSDP2, ZeRO-3</small>" in report._repr_html_()
