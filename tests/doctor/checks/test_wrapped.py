"""Watch check "wrapped" (ddp_lab/doctor/checks/wrapped.py): the model is not changed after DDP(...)
or fully_shard wrapped it. Its code has failing tests (corpus 12-14's broken.py: the error on the
user's line that changed the model) and passing ones (the fixed.py; a move to where the model
already is; a change followed by a new wrap)."""
import os
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {  # case folder -> (what changed, a unique substring of broken.py's faulty line)
    "12_head_replaced_after_ddp": ("module replaced", "model.module.head = nn.Linear(16, 3)"),
    "13_cast_after_ddp": ("cast from torch.float32 to torch.bfloat16", "model = model.to(torch.bfloat16)"),
    "14_fsdp2_head_added_after_shard": ("module replaced", "model.head = nn.Linear(8, 3)"),
}


def run(path):
    return corpus_report(path) or watch_script(path, nproc=2, timeout=60, checks=["wrapped", "state"])


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_case_is_caught_on_its_line(case):
    what, fault = CASES[case]
    path = os.path.join(CORPUS, case, "broken.py")
    report = run(path)
    hits = [f for f in report.findings if f.code == "model-changed-after-wrap"]
    assert len(hits) == 1, [(f.code, f.title) for f in report.findings]
    f = hits[0]
    assert (f.severity, f.lesson) == ("error", "01") and what in f.title
    assert f.where.startswith(f"broken.py:{line_of(path, fault)}: ") and fault in f.where
    assert "changed at step 0 on rank(s) 0, 1 of 2" in f.evidence[0]
    # its consequence, seen by the state check: the ranks' parameters differ from the first step
    assert any(g.code == "parameters-differ-after-step" and g.where == f.where for g in report.findings)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_case_gives_no_warning(case):
    report = run(os.path.join(CORPUS, case, "fixed.py"))
    assert [(f.code, f.severity) for f in report.findings if f.severity != "info"] == []
    assert report.status == "ok"
    assert all(not r.get("check-errors") for r in report.evidence.ranks)


REWRAP = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)))
    model = model.to("cpu")  # where it already is: nothing changes
    model.module[2] = nn.Linear(4, 3)
    model = DDP(model.module)  # wrapped again: DDP takes the new head
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


def test_a_no_op_move_and_a_change_wrapped_again_are_not_findings(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(REWRAP))
    report = run(str(path))
    assert [(f.code, f.where) for f in report.findings if f.severity != "info"] == []
    assert report.status == "ok"


# FSDP2's resume (pytorch/examples distributed/FSDP2/checkpoint.py): after fully_shard, the full
# state is distributed to DTensors and loaded with assign=True; FSDP2 takes the new parameters
# (a load_state_dict post-hook, torch/distributed/fsdp/_fully_shard/_fsdp_param.py:221-224).
# Under DDP the same assign=True leaves the reducer on the old parameters.
ASSIGN = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.tensor import distribute_tensor
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    full = {k: v.clone() for k, v in nn.Linear(4, 4).state_dict().items()}
    model = nn.Linear(4, 4)
    WRAP
    model.load_state_dict(STATE, strict=False, assign=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""
FSDP2 = ("fully_shard(model)", "{k: nn.Parameter(distribute_tensor(v, p.device_mesh, p.placements)) "
                               "for (k, v), p in zip(full.items(), model.state_dict().values())}")
DDP_ = ("model = DDP(model)", '{"module." + k: nn.Parameter(v) for k, v in full.items()}')


@pytest.mark.parametrize("wrap,state,found", [(*FSDP2, []), (*DDP_, ["parameter replaced"])])
def test_load_state_dict_with_assign_after_the_wrap(tmp_path, wrap, state, found):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(ASSIGN).replace("WRAP", wrap).replace("STATE", state))
    report = watch_script(str(path), nproc=2, timeout=90, checks=["wrapped"])
    hits = [f for f in report.findings if f.code == "model-changed-after-wrap"]
    assert [w for f in hits for w in found if w in f.title] == found, [(f.title, f.where) for f in hits]
    assert all(f.where.startswith("train.py:14: model.load_state_dict") for f in hits)
    assert report.status == "ok" and all(len(r["steps"]) >= 2 for r in report.evidence.ranks)
    assert all(not r.get("check-errors") for r in report.evidence.ranks)
