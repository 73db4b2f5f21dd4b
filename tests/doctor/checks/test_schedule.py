"""The schedule check (ddp_lab/doctor/checks/schedule.py): an LR schedule's length is the optimizer
steps each rank takes. Its code fails on blind case b03 (OneCycleLR's total_steps counted from
len(dataset) // batch while each rank takes half the batches) at the line that computed the
length, and stays silent on its fix (len(train_loader)); a run stopped on purpose and resumed
(b20's fixed script) is not judged. The length's reading, the source tracing and the judge are
tested without ranks.

    schedule-sized-for-one-process
"""
import functools
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from conftest import corpus_report

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
CODE = "schedule-sized-for-one-process"


@pytest.mark.slow
def test_a_schedule_counted_from_the_dataset_is_caught_at_the_line_that_computed_it():
    case = CORPUS / "b03_onecycle_total_steps"
    fault = tomllib.loads((case / "case.toml").read_text())["fault"]
    rep = corpus_report(case / "broken.py")
    hits = [f for f in rep.findings if f.code == CODE]
    assert len(hits) == 1, [(f.code, f.where) for f in rep.findings]
    f = hits[0]
    assert (f.severity, f.lesson) == ("warning", "20")
    assert f.where == f"broken.py:38: {fault}"
    assert "stepped it 10 times" in f.evidence[0] and "50% of the way" in f.evidence[0]
    assert "OneCycleLR(total_steps=20)" in f.evidence[0] and "2 (the world size) x 10" in f.evidence[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["b03_onecycle_total_steps", "b20_resume_warmup_restarts"])
def test_a_schedule_the_run_completes_or_resumes_is_no_finding(case):
    rep = corpus_report(CORPUS / case / "fixed.py")
    assert [f.code for f in rep.findings if f.code == CODE] == []
    schedules = [s for r in rep.evidence.ranks for s in r.get("schedules", [])]
    assert schedules, "the schedule was not seen"  # seen, and judged right
    if case.startswith("b03"):
        assert {(s["length"], s["pos"]) for s in schedules} == {(10, 10)}
    else:  # the first job stops half way on purpose: a resume follows, so it is not judged
        assert all(s["resumed"] for s in schedules)


# --- without ranks ----------------------------------------------------------------------------

def optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)


def total_for(total_steps):
    return lambda step: 1.0 - step / total_steps


def test_a_schedules_length_is_read_where_it_is_kept():
    from torch.optim import lr_scheduler as sch

    from ddp_lab.doctor.checks.schedule import length_of

    opt = optimizer()
    assert length_of(sch.OneCycleLR(opt, max_lr=0.1, epochs=3, steps_per_epoch=5)) == (15, "total_steps")
    assert length_of(sch.CosineAnnealingLR(optimizer(), T_max=40)) == (40, "T_max")
    warm = optimizer()
    seq = sch.SequentialLR(warm, [sch.LinearLR(warm, 0.1, total_iters=5),
                                  sch.CosineAnnealingLR(warm, T_max=95)], milestones=[5])
    assert length_of(seq) == (100, "milestones[-1] + T_max")
    assert length_of(sch.LambdaLR(optimizer(), total_for(64))) == (64, "total_steps")  # a closure's
    hf = functools.partial(lambda step, num_warmup_steps, num_training_steps: 1.0,
                           num_warmup_steps=4, num_training_steps=48)
    assert length_of(sch.LambdaLR(optimizer(), hf)) == (48, "num_training_steps")  # transformers'
    assert length_of(sch.StepLR(optimizer(), step_size=3)) is None  # a period, not a length
    assert length_of(sch.LambdaLR(optimizer(), lambda s: 0.9 ** s)) is None


SOURCE = '''
import torch
from torch.optim.lr_scheduler import OneCycleLR

FOUND = []


class Seen(OneCycleLR):
    def __init__(self, optimizer, max_lr, total_steps=None):
        super().__init__(optimizer, max_lr, total_steps=total_steps)
        FOUND.append(sys._getframe(1))
        FOUND.append(length_line(sys._getframe(1), Seen, ("total_steps",), lambda f: f == __file__))


def build(opt, steps):
    return Seen(opt, max_lr=0.1, total_steps=steps)


def main(opt, n, batch):
    per_epoch = n // batch
    total = 2 * per_epoch
    steps = total
    build(opt, steps)
    Seen(opt, 0.1, total)
    Seen(opt, 0.1, 3 * per_epoch)
    return FOUND
'''


def test_the_length_is_traced_to_the_line_that_computed_it(tmp_path):
    from ddp_lab.doctor.checks._schedule_source import length_line

    path = tmp_path / "sched_src.py"
    path.write_text(SOURCE)
    namespace = {"sys": sys, "length_line": length_line, "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    found = namespace["main"](optimizer(), 80, 8)
    # steps is build's parameter: into main's call of build, then `steps = total` to `total = ...`
    assert found[1] == (str(path), 21)
    assert found[3] == (str(path), 21)  # a positional argument, bound by the signature
    assert found[5] is None  # an expression written in the call: computed on the call's line


def record(length, pos, **more):
    return {"cls": "OneCycleLR", "length": length, "of": "total_steps", "pos": pos, "lr": 0.04,
            "line": "train.py:9: sched = OneCycleLR(opt, 0.1, total_steps=total)",
            "length_line": "train.py:8: total = 2 * (len(ds) // 8)", "resumed": False, **more}


def judged(world, *records, exit=0):
    from ddp_lab.doctor.checks.api import Evidence
    from ddp_lab.doctor.checks.schedule import judge

    ranks = [{"exit": exit, "schedules": list(records)} for _ in range(world)]
    return judge(Evidence(ranks, world_size=world))


def test_the_judge_wants_about_w_times_the_steps_taken():
    assert [f.where for f in judged(2, record(20, 10))] == ["train.py:8: total = 2 * (len(ds) // 8)"]
    assert [f.where for f in judged(4, record(39, 10))]  # per-rank rounding: about 4 x 10
    assert judged(2, record(10, 10)) == []  # the run ends with its schedule
    assert judged(2, record(30, 10)) == []  # a run stopped early at a third: not 1/W
    assert judged(1, record(20, 10)) == []  # one process: nothing to divide
    assert judged(2, record(6, 3)) == []  # too few steps to tell
    assert judged(2, record(20, 10, resumed=True)) == []  # continued by a resume
    assert judged(2, record(20, 10, member=True)) == []  # a SequentialLR's part
    assert judged(2, record(20, 10), exit=1) == []  # the run did not end as it meant to
