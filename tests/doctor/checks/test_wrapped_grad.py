"""The wrapped check's requires_grad part (ddp_lab/doctor/checks/_wrapped_grad.py): a parameter
whose requires_grad changes after DDP(...) built its reducer. Failing: blind case b45 (the backbone
unfrozen after DDP(...): an error at `p.requires_grad = True`, and the state check's parting
parameters named at the same line); passing: b45's fixed script (wrapped again after unfreezing),
a flag set and set back before any step. Freezing after DDP(...): a note at the line when
find_unused_parameters is off (DDP then raises its own error at the next forward), nothing when
it is on (DDP marks them unused every step; the ranks stay equal)."""
import os
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CASE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch",
                    "b45_unfreeze_after_ddp")
CODE = "model-changed-after-wrap"

pytestmark = pytest.mark.slow


def run(path):
    return corpus_report(str(path)) or watch_script(str(path), nproc=2, timeout=120,
                                                    checks=["wrapped", "state", "raised"])


def test_a_parameter_unfrozen_after_ddp_is_an_error_at_its_line():
    report = run(os.path.join(CASE, "broken.py"))
    [f] = [f for f in report.findings if f.code == CODE]
    assert (f.severity, f.lesson) == ("error", "01")
    assert f.where == "broken.py:47: p.requires_grad = True"
    assert f.title.startswith("a parameter was unfrozen after DDP(...): requires_grad set to True "
                              "(backbone.0.weight, backbone.0.bias, backbone.2.weight")
    assert "wrapped at broken.py:38: model = DDP(net); unfrozen at step 5 on rank(s) 0, 1 of 2" \
        in f.evidence[0]
    parted = [g for g in report.findings if g.code == "parameters-differ-after-step"]
    assert parted and parted[0].where == f.where  # the state check's consequence, at the cause


def test_wrapping_again_after_unfreezing_is_quiet():
    report = run(os.path.join(CASE, "fixed.py"))
    assert [f.code for f in report.findings if f.severity != "info"] == [], report.text()
    assert not any(f.code == CODE for f in report.findings)
    assert report.status == "ok"


SCRIPT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model = DDP(net, find_unused_parameters={find_unused})
    net[2].weight.requires_grad_(False)
    net[2].weight.requires_grad_(True)  # set back before any step: nothing changed
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if step == 2:
            net[0].requires_grad_(False)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


def freeze(tmp_path, find_unused: bool):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(find_unused=find_unused)))
    return run(path)


def test_freezing_after_ddp_without_find_unused_is_a_note_beside_ddps_own_error(tmp_path):
    report = freeze(tmp_path, find_unused=False)
    [f] = [f for f in report.findings if f.code == CODE]
    assert f.severity == "info" and f.where == "train.py:16: net[0].requires_grad_(False)"
    assert "frozen at step 2" in f.evidence[0]
    raised = [g for g in report.findings if g.code == "script-raised"]
    assert raised and "Expected to have finished reduction" in " ".join(raised[0].evidence)


def test_freezing_after_ddp_with_find_unused_is_handled_by_ddp(tmp_path):
    report = freeze(tmp_path, find_unused=True)
    assert not [f for f in report.findings if f.code in (CODE, "parameters-differ-after-step")]
    assert report.status == "ok", report.text()
