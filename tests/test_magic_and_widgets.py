"""The %%ddp cell magic and the try-it-yourself panel, driven as a notebook would drive them."""
import threading

import pytest

from ddp_lab.magic import cell_namespace, ddp_cell, parse_line
from ddp_lab.registry import get_scenario


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
    from ddp_lab.widgets import scenario_panel

    panel = scenario_panel(get_scenario("00", "rank_exits"))
    size, which, button = panel.children[1].children
    which.value = "fixed"
    panel.run()
    # outside a kernel the Output widget passes what it captures through to stdout
    printed = "".join(o.get("text", "") for o in panel.children[2].outputs) + capsys.readouterr().out
    assert "00/rank_exits fixed: ok (as declared)" in printed
    assert not button.disabled
