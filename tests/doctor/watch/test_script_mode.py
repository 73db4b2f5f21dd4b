"""watch's script mode (doctor/watch/script.py, core.py): the user's script unchanged on real ranks,
from `ddp-lab watch train.py`, from the Python API and inside torchrun (`-m ddp_lab.watch`, two
simulated nodes); bad input refused with a clear message and exit status 2, the script's own
failure reported with its status; nothing left running."""
import os
import subprocess
import sys
import textwrap

import pytest

from ddp_lab.doctor.watch import core
from ddp_lab.doctor.watch.script import WatchScriptError, watch_script

import ddp_lab.watch

_WATCH = ddp_lab.watch.__name__  # the module torchrun runs: -m ddp_lab.watch
pytestmark = pytest.mark.usefixtures("no_leftovers")  # nothing outlives a watch, failed or not
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "scripts", "train_ddp.py")

GOOD = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range({steps}):
        loss = model(torch.randn(2, 4) + dist.get_rank()).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    {tail}
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def script(tmp_path, text: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ddp_lab", "watch", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_correct_script_runs_unchanged_and_gives_no_finding(tmp_path):
    report = watch_script(script(tmp_path, GOOD.format(steps=3, tail="")), timeout=30)
    assert report.status == "ok" and report.steps == 3
    assert "ran unchanged on 2 ranks: 3 optimizer step(s)" in report.notes[0]
    assert "ddp(Linear)" in report.notes[0]
    assert not report.errors and not report.warnings, report.text()


def test_steps_end_at_the_optimizer_step_so_a_hang_is_the_step_it_happened_in(tmp_path):
    tail = ("if dist.get_rank() == 0:\n        dist.barrier()  # rank 1 never comes\n"
            "    else:\n        __import__('time').sleep(60)")
    report = watch_script(script(tmp_path, GOOD.format(steps=2, tail=tail)), timeout=4)
    assert report.status == "timeout"
    for r in (0, 1):  # two steps ended; the third (index 2) began and never ended
        steps = report.evidence.steps(r)
        assert [s["end"] is not None for s in steps] == [True, True, False]
    barrier = [c for c in report.run.ranks[0].collectives if c.op == "barrier"]
    assert barrier and report.evidence.step_at(0, barrier[-1].created) == 2


def test_the_script_arguments_reach_it(tmp_path):
    path = script(tmp_path, GOOD.format(steps="int(__import__('sys').argv[1])", tail=""))
    assert watch_script(path, ["4"], timeout=30).steps == 4


@pytest.mark.parametrize("text, says", [
    (None, "no such script"),
    ("import torch\ndef main(:\n    pass\n", "failed before it started a process group: SyntaxError"),
    ("import no_such_module_here\n", "ModuleNotFoundError"),
    ("print('hello')\n", "never started a process group"),
    ("import sys\nsys.exit(4)\n", "exited with status 4 before it started a process group"),
])
def test_bad_input_is_a_clear_message_and_exit_status_2(tmp_path, text, says):
    path = str(tmp_path / "missing.py") if text is None else script(tmp_path, text)
    with pytest.raises(WatchScriptError, match=says):
        watch_script(path, timeout=30)
    done = cli(path, "--timeout", "30")
    assert done.returncode == 2 and says.split(":")[0] in done.stderr, done.stderr
    if text and "main(:" in text:
        assert "def main(:" in done.stderr  # the script's own traceback is shown
        assert "runpy" not in done.stderr and core.__name__.rpartition(".")[2] + ".py" not in done.stderr


def test_a_script_that_exits_non_zero_gives_its_own_status(tmp_path):
    path = script(tmp_path, GOOD.format(steps=1, tail="import sys; sys.exit(3)"))
    done = cli(path, "--timeout", "30")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ranks error" in done.stdout


def test_bad_options_are_refused(tmp_path):
    path = script(tmp_path, GOOD.format(steps=1, tail=""))
    with pytest.raises(WatchScriptError, match="nproc-per-node must be an integer >= 1"):
        watch_script(path, nproc=0)
    with pytest.raises(WatchScriptError, match="not a Python file"):
        watch_script(script(tmp_path, "x", "train.txt"))


def _node(script_path: str) -> str:
    """One simulated node: torchrun's agent with --nnodes 2, meeting the other at the c10d
    rendezvous on the store this launch hosts (as lesson 17 simulates two nodes)."""
    import subprocess
    import sys

    from ddp_lab.launching.rankinfo import RANK_VARIABLES, environ

    endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    with environ({}, drop=RANK_VARIABLES):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                               "--nproc-per-node=1", "--rdzv-backend=c10d",
                               f"--rdzv-endpoint={endpoint}", "--rdzv-id=watch-two-nodes",
                               "--rdzv-conf=is_host=false", "--max-restarts=0",
                               "-m", _WATCH, "--timeout", "20", script_path],
                              capture_output=True, text=True, timeout=90)
    return done.stdout + f"\n[exit {done.returncode}]"


def test_inside_torchrun_on_two_simulated_nodes():
    """examples/scripts/train_ddp.py, unchanged, as one job of two nodes of one rank each."""
    from ddp_lab.launching.launcher import launch

    run = launch(_node, os.path.abspath(EXAMPLE), world_size=2, timeout=100)
    outputs = [r.value for r in run.ranks]
    assert run.status == "ok", run.describe_failure()
    reports = [o for o in outputs if "watch: train_ddp.py (world size 2, 8 steps, ranks ok)" in o]
    assert len(reports) == 1, outputs  # the global rank 0 reports, on its node
    assert "no findings" in reports[0], reports[0]
    assert all(o.endswith("[exit 0]") for o in outputs), outputs
