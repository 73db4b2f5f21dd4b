"""Watch check "state", code `ranks-train-in-different-modes` (ddp_lab/doctor/checks/
_state_modes.py): the ranks run the same wrapped model's training forward in different modes.
Real runs under watch on 2 ranks: caught on blind case b54 (rank 0 left in eval() after its
validation: named at that eval() line) and on a dropout model that rank 1 puts in eval mode with
`model.train(False)` at step 2; quiet on b54's fixed script, on a model every rank fine-tunes in
eval mode (BatchNorm frozen on purpose), and when rank 0 evaluates and goes back to train()."""
import os
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir)
CASE = os.path.join(ROOT, "tests", "corpus", "watch", "b54_rank0_eval_mode_sticks")
CODE = "ranks-train-in-different-modes"

pytestmark = pytest.mark.slow


def run(path):
    return corpus_report(path) or watch_script(str(path), nproc=2, timeout=120, checks=["state"])


def ours(report):
    return [f for f in report.findings if f.code == CODE]


def test_b54_rank0_left_in_eval_is_a_warning_at_its_eval():
    report = run(os.path.join(CASE, "broken.py"))
    [f] = ours(report)
    assert (f.severity, f.lesson) == ("warning", "01")
    assert f.where == "broken.py:32: self.model.eval()"
    assert f.title.endswith("from step 3 on: rank 0 in eval mode")
    assert f.evidence[0].startswith("rank 0: eval mode, rank 1: train mode")


def test_b54_fixed_back_in_train_mode_is_quiet():
    report = run(os.path.join(CASE, "fixed.py"))
    assert ours(report) == [] and report.status == "ok"
    assert [f.code for f in report.findings if f.severity != "info"] == []


SCRIPT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODE = {mode!r}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.Linear(8, 1)))
    if MODE == "all_eval":
        model.eval()  # every rank: BatchNorm frozen on purpose
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        if step == 2 and rank == 1 and MODE == "rank1_off":
            model.train(False)
        if step == 2 and rank == 0 and MODE == "eval_and_back":
            model.eval()
            with torch.no_grad():
                model(torch.randn(4, 8))
            model.train()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


def script(tmp_path, mode: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(mode=mode)))
    return run(path)


def test_a_rank_turned_to_eval_mode_is_named_at_its_train_false(tmp_path):
    report = script(tmp_path, "rank1_off")
    [f] = ours(report)
    assert f.where == "train.py:18: model.train(False)"
    assert f.evidence[0].startswith("rank 0: train mode, rank 1: eval mode in the training "
                                    "forward of step 2")


@pytest.mark.parametrize("mode", ["all_eval", "eval_and_back"])
def test_the_same_mode_on_every_rank_is_quiet(tmp_path, mode):
    report = script(tmp_path, mode)
    assert ours(report) == [] and report.status == "ok", report.text()
    masks = [[row[1] for row in r["state-modes"][0]] for r in report.evidence.ranks]
    assert masks == ([[2], [2]] if mode == "all_eval" else [[1], [1]])  # measured
