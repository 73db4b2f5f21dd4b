"""The %%ddp cell magic and the try-it-yourself panel, driven as a notebook would drive them."""
import os
import threading

import pytest

from ddp_lab.course import magic
from ddp_lab.course.magic import cell_namespace, ddp_cell, parse_line
from ddp_lab.launching import launcher, processes
from ddp_lab.course.registry import get_scenario


def test_a_cell_runs_on_every_rank_with_the_notebooks_names():
    import math

    user_ns = {"scale": 10.0, "math": math, "unused": object()}
    cell = ("import torch.distributed as dist\n"
            "t = torch.tensor([scale * (dist.get_rank() + 1)])\n"
            "dist.all_reduce(t)\n"
            "math.floor(t.item())\n")
    user_ns["torch"] = __import__("torch")
    result = ddp_cell("-n 2 --timeout 30 -o out", cell, user_ns)
    assert result is user_ns["out"] and result.values == [30, 30]


def test_env_and_no_init_reach_the_ranks():
    cell = "import os, torch.distributed as dist\n(os.environ['K'], dist.is_initialized())\n"
    result = ddp_cell("-n 2 --env K=V --no-init -q", cell, {})
    assert result is None
    assert [tuple(v) for v in ddp_cell("-n 2 --env K=V --no-init", cell, {}).values] == [("V", False)] * 2


def test_a_cell_that_raises_reports_the_rank():
    result = ddp_cell("-n 2 --timeout 20", "import torch\ntorch.zeros(2)[5]\n", {})
    assert result.status == "error" and result.root_cause.error.type == "IndexError"
    # The traceback starts at the cell, with its line shown, not in the launcher's exec(...)
    lines = result.root_cause.error.traceback.splitlines()
    assert lines[1:3] == ['  File "<%%ddp cell>", line 2, in <module>', "    torch.zeros(2)[5]"]
    assert os.path.basename(magic.__file__) not in result.root_cause.error.traceback
    # ... and the table shows it once: the stderr fold does not repeat the traceback fold
    html = result._repr_html_()
    assert html.count("index 5 is out of bounds") == 2 * 2  # per rank: headline, traceback fold
    assert ">stderr</summary>" not in html and ">traceback</summary>" in html


@pytest.mark.parametrize("line, message", [
    ("-n two", "bad %%ddp options"),
    ("--env K", "--env needs K=V"),
])
def test_bad_options_are_named(line, message):
    with pytest.raises(ValueError, match=message):
        parse_line(line)


def test_an_unpicklable_name_is_named():
    with pytest.raises(TypeError, match="the cell uses 'lock'"):
        cell_namespace("lock.acquire()", {"lock": threading.Lock()})


def test_the_panel_runs_the_chosen_variant_on_real_ranks(capsys):
    from ddp_lab.course.widgets import scenario_panel

    panel = scenario_panel(get_scenario("00", "rank_exits"))
    size, which, button = panel.children[1].children
    which.value = "fixed"
    panel.run()
    # outside a kernel the Output widget passes what it captures through to stdout
    printed = "".join(o.get("text", "") for o in panel.children[2].outputs) + capsys.readouterr().out
    assert "00/rank_exits fixed: ok (as declared)" in printed
    assert not button.disabled


STOPPABLE_CELL = """import os, time, torch, torch.distributed as dist
path = os.path.join({folder!r}, f"rank{{dist.get_rank()}}.pid")
open(path + ".tmp", "w").write(str(os.getpid()))
os.replace(path + ".tmp", path)
print("started", flush=True)
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
else:
    time.sleep(60)
"""


def test_the_stop_button_during_a_launch_shows_the_ranks_output_stacks_and_one_line(tmp_path, capsys, sigint_raises):
    # What Jupyter's stop button does: SIGINT to the kernel's process, here this one, while a
    # %%ddp cell's ranks are running (rank 0 in all_reduce, rank 1 asleep).
    import os
    import signal
    import time

    from IPython.core.interactiveshell import InteractiveShell

    from conftest import alive
    from ddp_lab import load_ipython_extension
    from ddp_lab.launching.display import INTERRUPTED_LINE
    from ddp_lab.launching.results import LaunchInterrupted

    pid_files = [tmp_path / f"rank{r}.pid" for r in (0, 1)]

    def press_stop():
        end = time.time() + 120
        while not all(p.exists() for p in pid_files) and time.time() < end:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    shell = InteractiveShell.instance()
    try:
        load_ipython_extension(shell)
        threading.Thread(target=press_stop, daemon=True).start()
        outcome = shell.run_cell("%%ddp -n 2 --timeout 60\n" + STOPPABLE_CELL.format(folder=str(tmp_path)))
    finally:
        InteractiveShell.clear_instance()
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert isinstance(outcome.error_in_exec, LaunchInterrupted)  # the cell still fails: run-all stops
    assert "[rank 0] started" in out and "[rank 1] started" in out
    assert "rank 0 was stopped in:\n  all_reduce  (torch/distributed/distributed_c10d.py)" in out
    assert "rank 0: timeout  interrupted in all_reduce()" in out
    assert out.rstrip().splitlines()[-1] == f"LaunchInterrupted: {INTERRUPTED_LINE}"  # one line
    files = [os.path.basename(m.__file__) for m in (launcher, processes, magic)]
    assert not any(name in out for name in files + ["Traceback"])
    pids = [int(p.read_text()) for p in pid_files]
    assert not [pid for pid in pids if alive(pid)], "a rank outlived the interrupt"


def test_a_long_pytorch_message_is_cut_with_an_ellipsis_and_kept_whole_in_its_tooltip():
    import html
    import re

    from ddp_lab.launching.display import HEADLINE_WIDTH

    cell = ("import torch\nx = torch.ones(3, requires_grad=True)\ny = x.sigmoid()\ny.mul_(2)\n"
            "y.sum().backward()\n")
    result = ddp_cell("-n 1 --timeout 20 -q -o r", cell, ns := {}) or ns["r"]
    headline = result.ranks[0].headline
    assert len(headline) > HEADLINE_WIDTH and "modified by an inplace operation" in headline
    page = result._repr_html_()
    cell_html = re.search(r'<td style="text-align:left;min-width[^"]*" title="([^"]*)">([^<]*)</td>', page)
    assert cell_html, "the 'what happened' cell has no tooltip"
    assert html.unescape(cell_html.group(1)) == headline  # the whole message
    shown = html.unescape(cell_html.group(2))
    assert shown.endswith("…") and len(shown) <= HEADLINE_WIDTH and headline.startswith(shown[:-1])
    assert '<td style="text-align:left;white-space:nowrap">rank 0</td>' in page
