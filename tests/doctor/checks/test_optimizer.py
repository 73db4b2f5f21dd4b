"""Watch check "optimizer" (ddp_lab/doctor/checks/optimizer.py): every rank's optimizer steps with
the same hyperparameters, on parameters that receive gradients, on gradients of this step only.
Each code has failing tests (a blind corpus case, or a small script with the user's line at
fault) and passing ones (the same script made right, and the legitimate look-alikes: ranks that
each train their own model, a frozen part, deliberate accumulation)."""
import os
import textwrap

import pytest

from conftest import corpus_report
from ddp_lab.doctor.checks._optimizer_judge import _difference, _shared
from ddp_lab.doctor.checks._optimizer_rank import numbers
from ddp_lab.doctor.watch.script import watch_script

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CODES = ("optimizer-hyperparameters-differ", "optimizer-steps-without-gradients",
         "gradients-accumulate-across-steps")


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


def ours(report):
    return [f for f in report.findings if f.code in CODES]


def run(tmp_path, body, **fmt):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("BODY", textwrap.indent(textwrap.dedent(body), "    ")))
    report = watch_script(str(path), nproc=2, timeout=60, checks=["optimizer"])
    assert all(not r.get("check-errors") for r in report.evidence.ranks), \
        [r.get("check-errors") for r in report.evidence.ranks]
    return path, report


SCRIPT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
BODY
    dist.destroy_process_group()


main()
"""


def test_b05_a_decay_on_rank_0_only_is_named_at_its_statement():
    path = os.path.join(CORPUS, "b05_lr_decay_on_rank0_only", "broken.py")
    hits = [f for f in corpus_report(path).findings if f.code == "optimizer-hyperparameters-differ"]
    assert hits and hits[0].severity == "error" and hits[0].lesson == "19"
    fault = 'group["lr"] *= LR_DECAY'
    assert hits[0].where == f"broken.py:{line_of(path, fault)}: {fault}"
    assert "rank 0 0.003, rank 1 0.01" in hits[0].evidence[0] and "step 3" in hits[0].title


def test_b05_fixed_decays_on_every_rank_and_is_quiet():
    assert ours(corpus_report(os.path.join(CORPUS, "b05_lr_decay_on_rank0_only", "fixed.py"))) == []


SCHEDULED = """
model = DDP(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
for step in range(4):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    if {who}:
        sched.step()
"""


@pytest.mark.parametrize("who, caught", [("rank == 0 and step == 1", True), ("step == 1", False)])
def test_a_scheduler_stepped_on_some_ranks_is_named_at_its_step(tmp_path, who, caught):
    path, report = run(tmp_path, SCHEDULED.format(who=who))
    hits = ours(report)
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert [f.code for f in hits] == ["optimizer-hyperparameters-differ"]
    assert hits[0].where == f"train.py:{line_of(path, 'sched.step()')}: sched.step()"
    assert "StepLR.step" in " ".join(hits[0].evidence) and "from step 2" in hits[0].title


BUILT = """
model = DDP(nn.Linear(4, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay={wd})
for step in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


@pytest.mark.parametrize("wd, caught", [("0.01 * (rank + 1)", True), ("0.01", False)])
def test_a_per_rank_value_at_construction_is_named_at_the_construction(tmp_path, wd, caught):
    path, report = run(tmp_path, BUILT.format(wd=wd))
    hits = ours(report)
    if not caught:
        assert hits == []
        return
    assert hits[0].code == "optimizer-hyperparameters-differ" and "weight_decay" in hits[0].title
    assert hits[0].where.startswith(f"train.py:{line_of(path, 'opt = torch.optim.AdamW')}: ")


def test_ranks_that_each_train_their_own_model_may_differ(tmp_path):
    _, report = run(tmp_path, """
        torch.manual_seed(rank)  # each rank its own model: no DDP, no sync
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1))
        for step in range(3):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
        """)
    assert ours(report) == [] and report.status == "ok"


IDLE = """
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{between}
for step in range(3):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


@pytest.mark.parametrize("between, caught", [
    ("model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))  # rebuilt: new parameters", True),
    ("model[0].requires_grad_(False)  # a frozen part", False)])
def test_an_optimizer_whose_parameters_never_get_a_gradient_is_named_where_it_was_built(
        tmp_path, between, caught):
    path, report = run(tmp_path, IDLE.format(between=between))
    hits = [f for f in ours(report) if f.code == "optimizer-steps-without-gradients"]
    if not caught:
        assert ours(report) == []
        return
    assert hits and hits[0].severity == "error"
    assert hits[0].where == f"train.py:{line_of(path, 'opt = torch.optim.SGD')}: opt = torch.optim.SGD(model.parameters(), lr=0.1)"
    assert "stepped 3 times" in hits[0].evidence[0] and "model.0.weight" in hits[0].evidence[-1]


ACCUMULATED = """
model = DDP(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    for micro in range(2):
        model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    {zero}
"""


@pytest.mark.parametrize("zero, caught", [
    ("pass", True),
    ("opt.zero_grad()", False),
    ("opt.zero_grad(set_to_none=False)", False),
    ("model.zero_grad(set_to_none=False)", False)])
def test_gradients_never_zeroed_are_named_at_the_step_and_accumulation_is_not(tmp_path, zero, caught):
    path, report = run(tmp_path, ACCUMULATED.format(zero=zero))
    hits = ours(report)
    if not caught:
        assert hits == []
        return
    assert [(f.code, f.severity) for f in hits] == [("gradients-accumulate-across-steps", "warning")]
    assert hits[0].where == f"train.py:{line_of(path, 'opt.step()')}: opt.step()"
    assert "at step 1" in hits[0].evidence[0]


def test_the_hyperparameters_recorded_and_compared():
    import torch

    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=torch.tensor(0.01), betas=(0.9, 0.99))
    row = dict(numbers(opt)[0])
    assert row["lr"] == pytest.approx(0.01) and row["betas[1]"] == 0.99 and row["amsgrad"] == 0.0
    same = [[["lr", 0.1], ["momentum", 0.9]]]
    assert _difference([same, same]) is None
    assert _difference([same, [[["lr", 0.1 * (1 + 1e-12)], ["momentum", 0.9]]]]) is None
    assert _difference([same, [[["lr", 0.05], ["momentum", 0.9]]]]) == (0, "lr", [0.1, 0.05])
    assert _shared([{"sample": "ab"}, {"sample": "ab"}]) and not _shared([{"sample": "ab"}, {"sample": "cd"}])
    assert _shared([{"wrapped": True}, {"wrapped": True}])
