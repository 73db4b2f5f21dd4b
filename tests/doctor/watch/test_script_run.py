"""A watched script's run as its user sees it (issue 44): `--timeout` per step (a run longer than
the timeout whose steps are short passes; a step that hangs is reported, with every rank's stack;
the first step has its own allowance), the script's output shown as it runs, prefixed as
`torchrun --tee 3` prefixes it, then the report; `--json` whole (the script's output on stderr,
`seconds` real, the exit-2 error as JSON); `--cost`; under torchrun a finding that reads as one."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

import ddp_lab.watch
from ddp_lab.doctor.watch.script import WatchScriptError, watch_script

pytestmark = pytest.mark.usefixtures("no_leftovers")

LOOP = """
import sys, time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

time.sleep({before})  # the first step: imports, data loading, compile
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({steps}):
    print(f"step {{step}} on {{rank}}")
    if step == {hang}:
        if rank == 0:
            dist.barrier()  # rank 1 never comes
        else:
            time.sleep(600)
    time.sleep({pause})
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    {edit}
{tail}
dist.destroy_process_group()
"""


def script(tmp_path, before=0, steps=3, hang=-1, pause=0.0, tail="", edit="", name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(LOOP.format(before=before, steps=steps, hang=hang,
                                                pause=pause, tail=tail, edit=edit)))
    return str(path)


def cli(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "ddp_lab", "watch", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def test_a_run_longer_than_the_timeout_whose_steps_are_short_passes(tmp_path):
    """--timeout 3: a first step of 4 s (its own allowance), then 20 steps of 0.25 s: 9 s in all.
    Before issue 44 the timeout counted from the run's start and this run was a hang."""
    start = time.time()
    report = watch_script(script(tmp_path, before=4, steps=20, pause=0.25), timeout=3)
    assert time.time() - start > 3 + 4
    assert report.status == "ok" and report.steps == 20, report.text()
    assert not report.errors and not report.warnings, report.text()


def test_a_step_that_hangs_is_reported_with_every_ranks_stack(tmp_path):
    """Eight steps of 0.5 s (longer than --timeout 3 together), then step 8 hangs: it is the hang,
    at its own line, with each rank's stack; the eight before it ended."""
    report = watch_script(script(tmp_path, steps=10, hang=8, pause=0.5), timeout=3)
    assert report.status == "timeout"
    for r in (0, 1):
        assert [s["end"] is not None for s in report.evidence.steps(r)] == [True] * 8 + [False]
        stack = report.run.ranks[r].stack
        assert "train.py" in stack, stack  # where each rank stood, in the user's script
    assert "time.sleep(600)" in report.run.ranks[1].stack or "line 17" in report.run.ranks[1].stack
    hang = [f for f in report.errors if f.code in ("hang", "collectives-differ-between-ranks")]
    assert hang and "train.py:1" in hang[0].where, report.text()


def test_the_first_step_has_its_own_allowance(tmp_path):
    """A first step that never ends is stopped at --first-step-timeout, not at --timeout."""
    report = watch_script(script(tmp_path, steps=3, hang=0), timeout=30, first_step_timeout=4)
    assert report.status == "timeout"
    for r in (0, 1):
        steps = report.evidence.steps(r)
        assert [s["end"] for s in steps] == [None]
        assert report.run.ranks[r].failed_at - steps[0]["begin"] < 15  # not --timeout's 30 s
        assert report.evidence.ranks[r]["step-hooks"]["first"] == 4
    with pytest.raises(WatchScriptError, match="within the first step's allowance \\(4 s\\)"):
        watch_script(script(tmp_path, before=60), timeout=30, first_step_timeout=4)


def test_the_output_shows_as_torchrun_tee_shows_it_then_the_report(tmp_path):
    path = script(tmp_path, steps=2, tail="print('done', file=sys.stderr)")
    done = cli("--timeout", "30", "--cost", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    report = next(i for i, line in enumerate(out) if line.startswith("watch: train.py"))
    assert {"[default0]:step 0 on 0", "[default1]:step 1 on 1"} <= set(out[:report])
    assert "[default0]:done" in done.stderr.splitlines()  # stderr stays stderr
    assert any(line.startswith("  rank 1: first step") for line in out[report:])  # --cost


def test_json_is_whole_on_stdout_and_the_output_on_stderr(tmp_path):
    script(tmp_path, steps=2, tail="print('done', file=sys.stderr)")
    done = cli("--timeout", "30", "--json", "--cost", "--local-ranks-filter", "0", "train.py",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # nothing of the script's on stdout
    assert data["exit_status"] == 0 and data["script_status"] == 0 and data["steps"] == 2
    assert data["seconds"] > 0
    assert [c["steps"] for c in data["cost"]] == [2, 2]
    assert data["cost"][0]["checks_per_step_s"] > 0
    err = done.stderr.splitlines()
    assert "[default0]:step 1 on 0" in err and "[default0]:done" in err
    assert not any(line.startswith("[default1]:") for line in err)  # --local-ranks-filter 0


def test_bad_input_under_json_is_json_too(tmp_path):
    done = cli("--json", str(tmp_path / "missing.py"))
    assert done.returncode == 2
    data = json.loads(done.stdout)
    assert data["exit_status"] == 2 and "no such script" in data["error"]
    done = cli("--json", "--local-ranks-filter", "5", str(tmp_path / "missing.py"))
    assert done.returncode == 2 and "names no rank" in json.loads(done.stdout)["error"]


def test_under_torchrun_a_finding_reads_as_a_finding_and_the_timeout_is_per_step(tmp_path):
    """Inside torchrun: rank 1 edits its weights after each step (an error-level finding); six
    steps of 0.5 s (longer than --timeout 3 together), then step 6 hangs: each rank records its
    own stack as hung at step 6. The JSON alone on stdout, the exit status 1, and torchrun's
    FAILED summary names watch's findings, not a Python traceback."""
    script(tmp_path, steps=8, hang=6, pause=0.5,
           edit="model.module.weight.data += rank  # rank 1's own")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "-m", ddp_lab.watch.__name__, "--json",
                           "--timeout", "3", "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    data = json.loads(done.stdout)  # nothing of the script's on stdout
    assert done.returncode == 1 and data["exit_status"] == 1, done.stderr[-3000:]
    assert data["status"] == "timeout" and data["steps"] == 6 and data["seconds"] > 3
    codes = {f["code"] for f in data["findings"]}
    assert "parameters-differ-after-step" in codes, codes
    hang = [f for f in data["findings"] if f["code"] in ("hang", "collectives-differ-between-ranks")]
    assert hang and "train.py:1" in hang[0]["where"], data["findings"]
    said = " ".join(hang[0]["evidence"])
    assert "rank 0" in said and "rank 1" in said  # where each rank stood, from its own stack
    assert "step 5 on 1" in done.stderr  # the script's own output, on stderr
    assert "ddp-lab watch: 2 error-level findings in train.py (the report is above)" in done.stderr
    assert "Not a crash: a step hung and watch ended the ranks (--timeout)" in done.stderr
