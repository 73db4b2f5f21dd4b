"""Watch check "collectives" (ddp_lab/doctor/checks/collectives.py): the ranks enter the same
collectives in the same order; where they part or hang, the step and the user's line.
Each code has failing tests (the corpus cases' broken.py, and a script whose ranks hang outside
any collective) and passing ones (their fixed.py: no finding from this check). The loop-exit
reading of the source is tested on its own, without ranks."""
import os
import textwrap

import pytest

import ddp_lab.watch

from ddp_lab.doctor.checks import _collectives_loop as loop, collectives
from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {  # case folder -> a unique substring of broken.py's line at fault
    "60_early_stop_per_rank": "if loss.item() < 2.5:",  # the if around a per-rank break
    "61_uneven_shards_hang": "loader = DataLoader(shard, batch_size=5)",  # the loop's iterable
    "62_barrier_only_on_rank0": "dist.barrier()  # wait until",  # a line only rank 0 calls from
    "63_validation_on_rank0_ddp": "correct = (model(xv)",  # DDP's buffer broadcast, rank 0 only
    "64_metric_order_per_rank": "totals = {name: all_reduce(value)",  # same line, other shapes
}


def run(path, timeout=20):
    return corpus_report(path) or watch_script(path, nproc=2, timeout=timeout, checks=["collectives"])


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_collectives_differ_between_ranks_is_caught_on_its_line(case):
    path = os.path.join(CORPUS, case, "broken.py")
    report = run(path)
    hits = [f for f in report.findings if f.code == "collectives-differ-between-ranks"]
    assert hits, [(f.code, f.title) for f in report.findings]
    f = hits[0]
    assert f.severity == "error" and f.lesson == "13"
    assert f.where.startswith(f"broken.py:{line_of(path, CASES[case])}: "), f.where
    assert any(" in step " in e for e in f.evidence), f.evidence  # attributed to a step


@pytest.mark.slow
@pytest.mark.parametrize("case", ["60_early_stop_per_rank", "62_barrier_only_on_rank0",
                                  "63_validation_on_rank0_ddp"])
def test_fixed_case_gives_no_collectives_finding(case):
    report = run(os.path.join(CORPUS, case, "fixed.py"))
    assert report.status == "ok"
    mine = [f for f in report.findings if f.code in collectives.CHECK.codes]  # others' notes may come
    assert not mine, [(f.code, f.title) for f in mine]


HANG = '''
    """Both ranks wait, after their first step, for an event nobody sets: a hang outside any
    collective (the flight recorder shows the ranks alike)."""
    import threading

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        model = DDP(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ready = threading.Event()
        for step in range(3):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            if step == 0 and WAIT:
                ready.wait()  # never set
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


@pytest.mark.slow
@pytest.mark.parametrize("wait", [True, False])
def test_hang_is_attributed_to_the_step_that_never_ended_and_its_line(tmp_path, wait):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(HANG).replace("WAIT", str(wait)))
    report = run(str(path), timeout=5)  # per step (the first has its own 120 s): a step here takes ms
    hangs = [f for f in report.findings if f.code == "hang"]
    if not wait:
        assert report.status == "ok" and not report.findings
        return
    assert report.status == "timeout"
    assert len(hangs) == 1, [(f.code, f.title) for f in report.findings]
    f = hangs[0]
    assert f.severity == "error" and f.lesson == "13"
    assert f.where == f"train.py:{line_of(path, 'ready.wait()')}: ready.wait()  # never set"
    # the step that never ended is step 1 (step 0 ended when its opt.step() returned)
    assert all(" in step 1 at train.py:" in e for e in f.evidence[:2]), f.evidence


LOOPS = '''
def main(rank):
    loader = make(rank)
    for epoch in range(2):
        for x in enumerate(loader):
            opt.step()
            if x > rank:
                log(x)
                break
    data = make(rank)
    it = iter(data)
    while True:
        opt.step()
'''


def test_loop_exit_is_the_if_around_a_break_else_where_the_iterable_was_made(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text(LOOPS)
    line, how = loop.loop_exit([str(path), 6])  # opt.step() in the inner for loop
    assert line == 7 and "break" in how  # the `if x > rank:` around the break
    path.write_text(LOOPS.replace("                break\n", ""))
    line, how = loop.loop_exit([str(path), 6])
    assert line == 3 and "ran out" in how  # `loader = make(rank)`: enumerate(...) unwrapped
    line, how = loop.loop_exit([str(path), 12])  # the while loop
    assert line == 11 and "while" in how
    assert loop.inside_loop([str(path), 6], [("loops.py", 6), ("loops.py", 9)])
    assert not loop.inside_loop([str(path), 6], [("loops.py", 9), ("other.py", 6)])


def _report_json(out: str) -> dict:
    """Rank 0's --json report among the ranks' own prints."""
    import json
    import re

    decoder = json.JSONDecoder()
    for m in re.finditer(r"^\{", out, re.M):
        try:
            found, _ = decoder.raw_decode(out[m.start():])
        except ValueError:
            continue
        if isinstance(found, dict) and "findings" in found:
            return found
    raise AssertionError(f"no report in the output:\n{out[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["60_early_stop_per_rank", "62_barrier_only_on_rank0"])
def test_inside_torchrun_the_hook_and_the_ranks_positions_name_the_line(case):
    """Under torchrun there is no flight recorder (ev.run is None): 62 is named from the hook's
    records (rank 0 alone called barrier), 60 from where each rank stood (rank 0 returned, rank
    1 still in the loop). --standalone: torchrun picks a free port (torch/distributed/run.py:990).
    --timeout 40: the scripts hang for 5 s (their own gloo timeout); a slow start on a loaded
    machine must not read as a hang of step 0."""
    import subprocess
    import sys

    from ddp_lab.launching.rankinfo import RANK_VARIABLES, environ

    path = os.path.join(CORPUS, case, "broken.py")
    with environ({}, drop=RANK_VARIABLES):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2", "--max-restarts=0", "-m", ddp_lab.watch.__name__,
                               "--timeout", "40", "--json", path],
                              capture_output=True, text=True, timeout=150)
    report = _report_json(done.stdout)
    hits = [f for f in report["findings"] if f["code"] == "collectives-differ-between-ranks"]
    assert hits, [(f["code"], f["title"]) for f in report["findings"]]
    assert hits[0]["where"].startswith(f"broken.py:{line_of(path, CASES[case])}: ")
    assert done.returncode != 0
