"""What a learner sees in JupyterLab without running anything, and what `%%ddp` shows: the
points of issue 16 a test can see outside a browser (tests/course/test_browser_lab.py sees the rest)."""

import re

import nbformat
import pytest

from conftest import REPO as ROOT
from ddp_lab.course.magic import ddp_cell
from ddp_lab.course.registry import get_scenario
from ddp_lab.course.widgets import TEXT_LIMIT, panel_text, scenario_panel

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"


def test_a_ddp_cell_shows_what_ranks_printed_and_returned(capsys):
    cell = ("import torch.distributed as dist\n"
            "print('hello from', dist.get_rank())\n"
            "t = torch.ones(1) * (dist.get_rank() + 1)\n"
            "dist.all_reduce(t)\n"
            "int(t.item()) * 10\n")
    result = ddp_cell("-n 2 --timeout 30", cell, {"torch": __import__("torch")})
    shown = capsys.readouterr().out.splitlines()
    assert result.values == [30, 30]
    assert shown == ["[rank 0] hello from 0", "[rank 1] hello from 1",
                     "rank 0 returned 30", "rank 1 returned 30"]


def test_a_quiet_ddp_cell_shows_nothing(capsys):
    assert ddp_cell("-n 2 -q", "print('x')\n1\n", {}) is None
    assert capsys.readouterr().out == ""


def test_the_panel_has_a_readable_text_form():
    scenario = get_scenario("01", "unused_parameter")
    panel = scenario_panel(scenario)
    text = panel._repr_mimebundle_()["text/plain"]  # what Jupyter stores beside the widget view
    assert text == panel_text(scenario) == repr(panel)
    assert "01/unused_parameter" in text and "VBox" not in text and len(text) <= TEXT_LIMIT


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_widget_outputs_read_as_text(path):
    nb = nbformat.read(path, as_version=4)
    texts = [o["data"].get("text/plain", "") for c in nb.cells for o in c.get("outputs", [])
             if WIDGET in o.get("data", {})]
    bad = [t for t in texts if t.startswith(("VBox(", "HBox("))]
    assert not bad, f"{path.name}: widget outputs committed as a children list: re-execute it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebooks_keep_the_kernelspec_jupyterlab_writes(path):
    # JupyterLab rewrites "Python 3" to "Python 3 (ipykernel)" on open and marks the notebook
    # modified; tools/execute_notebook.py writes the latter.
    spec = nbformat.read(path, as_version=4).metadata.get("kernelspec", {})
    assert spec.get("display_name") == "Python 3 (ipykernel)", f"{path.name}: re-execute it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_outputs_hold_nothing_a_rank_wrote_to_stderr(path):
    # A kernel run by tools/execute_notebook.py records what a child process writes to the
    # inherited stderr; the kernel that `pytest --nbval` runs does not, so such an output fails
    # strict nbval in CI while it passes where it was executed (a runpy warning on every spawned
    # rank did). Lessons print what a rank wrote from the parent, from the RunResult.
    nb = nbformat.read(path, as_version=4)
    stderr = [(i, "".join(o.get("text", ""))[:120]) for i, c in enumerate(nb.cells)
              for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert not stderr, f"{path.name}: stderr outputs in cells {stderr}"


CORE_WORDS = 1500  # COURSE.md: the core path, everything not tagged `deeper`, about 15 minutes


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_core_path_stays_within_its_words(path):
    # Words matched by \w+ in markdown not tagged `deeper` (solutions count: COURSE.md's rule).
    cells = nbformat.read(path, as_version=4).cells
    core = sum(len(re.findall(r"\w+", c.source)) for c in cells
               if c.cell_type == "markdown" and "deeper" not in c.metadata.get("tags", []))
    assert core <= CORE_WORDS, f"{path.name}: {core} words on the core path; tag second reading 'deeper'"
