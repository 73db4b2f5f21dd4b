"""Watch check "ddp_settings" (ddp_lab/doctor/checks/ddp_settings.py): DDP's settings against what
DDP saw. `find-unused-parameters-unneeded` fails on blind case b40 (find_unused_parameters=True on
a model that uses every parameter: a warning at the keyword's line) and on a DDP(...) spread over
lines (the keyword's own line); it stays quiet on b40's fixed script (the flag off), on a
LayerDrop model (examples/layerdrop.py: layers skipped at random, the flag needed), and on a
model that skips a parameter once, at step 12, where DDP's own logging data (sampled in the
first 10 iterations, then 1 in 100) still says unused_parameter_size=0."""
import os
import textwrap

import pytest

from ddp_lab.doctor.checks.ddp_settings import _keyword_line
from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir)
CASE = os.path.join(ROOT, "tests", "corpus", "watch", "b40_ddp_find_unused_all_used")
CODE = "find-unused-parameters-unneeded"

pytestmark = pytest.mark.slow


def run(path):
    return corpus_report(path) or watch_script(str(path), nproc=2, timeout=120,
                                               checks=["ddp_settings"])


def ours(report):
    return [f for f in report.findings if f.code == CODE]


def test_the_flag_on_a_model_that_uses_every_parameter_is_a_warning_at_the_keyword():
    report = run(os.path.join(CASE, "broken.py"))
    [f] = ours(report)
    assert (f.severity, f.lesson) == ("warning", "01")
    assert f.where == "broken.py:45: model = DDP(ResMLP(), find_unused_parameters=True)"
    assert f.evidence[0].startswith("every rank used every parameter in each of the 10 steps")
    assert any("find_unused_parameters=1, unused_parameter_size=0" in e for e in f.evidence)


def test_the_flag_off_is_quiet():
    report = run(os.path.join(CASE, "fixed.py"))
    assert ours(report) == [] and report.status == "ok"
    assert [f.code for f in report.findings if f.severity != "info"] == []


SCRIPT = """
import sys
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
sys.path.insert(0, {examples!r})
from layerdrop import Encoder


class Gate(nn.Module):  # uses every parameter, except `extra` at one step
    def __init__(self):
        super().__init__()
        self.body, self.extra = nn.Linear(8, 8), nn.Linear(8, 8)
        self.skip_at = -1

    def forward(self, x):
        x = self.body(x)
        return x if self.skip_at == 0 else self.extra(x)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = {net}
    model = DDP(
        net,
        find_unused_parameters=True,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(14):
        if hasattr(net, "skip_at"):
            net.skip_at = {skip} - step
        loss = model(torch.randn(4, 5, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


def script(tmp_path, net: str, skip: int):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(
        examples=os.path.abspath(os.path.join(ROOT, "examples")), net=net, skip=skip)))
    return run(path)


def test_a_ddp_call_over_several_lines_is_named_at_its_keyword(tmp_path):
    report = script(tmp_path, "Gate()", skip=-1)  # never skips
    [f] = ours(report)
    assert f.where == "train.py:26: find_unused_parameters=True,"
    assert "each of the 14 steps" in f.evidence[0]


def test_a_layerdrop_model_needs_the_flag_and_is_quiet(tmp_path):
    report = script(tmp_path, "Encoder(dim=8, layers=4, p=0.5)", skip=-1)
    assert ours(report) == [] and report.status == "ok", report.text()
    recs = [r["ddp-settings"][0] for r in report.evidence.ranks]
    assert all(r["unused_steps"] >= 1 for r in recs)  # measured, not assumed


def test_one_step_with_an_unused_parameter_past_ddps_sampling_keeps_it_quiet(tmp_path):
    report = script(tmp_path, "Gate()", skip=12)
    assert ours(report) == [] and report.status == "ok", report.text()
    for r in report.evidence.ranks:
        rec = r["ddp-settings"][0]
        assert (rec["first_unused"], rec["unused_steps"], rec["steps"]) == (12, 1, 14)
        # DDP's own logging data never sampled step 12: on its own it would say "never unused"
        assert rec["logging"]["unused_parameter_size"] == 0


def test_the_keyword_is_found_in_a_dict_of_settings(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("cfg = {'find_unused_parameters': True}\n\nmodel = DDP(net, **cfg)\n")
    assert _keyword_line(str(path), 3) == "train.py:1: cfg = {'find_unused_parameters': True}"
    path.write_text("model = DDP(net, **cfg)\n")
    assert _keyword_line(str(path), 1) == ""
