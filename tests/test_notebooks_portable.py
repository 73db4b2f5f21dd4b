"""The notebooks' cells whose outputs can depend on PyTorch's CPU kernels pass strict nbval with
the portable kernels as well as with this machine's own (ATEN_CPU_CAPABILITY=default; the native
pass is pytest's own collection of notebooks/). A printed figure that depends on the instruction
set fails here, not on a learner's laptop. Which cells: tests/kernel_cells.json, measured by
tools/kernel_cells.py; with the cells they need (tests/portable_cells.py). See tests/conftest.py
(KernelPass) for how the pass runs."""
import os
import re

import nbformat
import pytest

from conftest import REPO
from portable_cells import kernel_cells, needed, plan


def test_the_kernel_cell_list_is_current():
    """Each notebook's entry carries the hash of its code cells and outputs: a notebook changed
    or added since its cells were measured fails here until they are measured again."""
    stale = kernel_cells().stale()
    assert not stale, ("tests/kernel_cells.json is stale for "
                       + "; ".join(f"{name} ({why})" for name, why in sorted(stale.items()))
                       + f": run `{kernel_cells().COMMAND}` (it measures those notebooks again)")


def test_the_list_notices_a_changed_cell(tmp_path):
    path = REPO / "notebooks" / "00_launching_ranks.ipynb"
    nb = nbformat.read(path, as_version=4)
    before = kernel_cells().content_hash(path)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.source += "\n"
    nbformat.write(nb, tmp_path / path.name)
    assert kernel_cells().content_hash(tmp_path / path.name) != before
    markdown = next(c for c in nb.cells if c.cell_type == "markdown")
    code.source = code.source[:-1]
    markdown.source += " (edited)"
    nbformat.write(nb, tmp_path / path.name)
    assert kernel_cells().content_hash(tmp_path / path.name) == before  # prose only: still current


def test_the_cells_a_listed_cell_needs():
    sources = [
        "import torch\nfrom ddp_lab import get_lesson, launch",       # 0 binds torch, get_lesson, launch
        "lesson = get_lesson('13')\nscenario = lesson.scenario('x')",  # 1 static names
        "torch.manual_seed(0)",                                        # 2 binds nothing: a setting
        "folder = make_folder()",                                      # 3
        "other = scenario.run('fixed')",                               # 4 launches; read by no one
        "dumped = scenario.run('broken', env={'DIR': folder})",        # 5 launches, reads folder
        "raw = launch(read_traces, folder)",                           # 6 launches, reads folder
        "print(lesson.title, raw.values[0])",                          # 7 the listed cell
        "later = 1",                                                   # 8 after it
    ]
    assert needed(sources, {7}) == {0, 1, 2, 3, 5, 6, 7}
    # 4 reads `scenario` (a lesson's), not what 7 reads through a name; 8 comes after


def test_every_listed_cell_is_a_code_cell_of_its_notebook():
    listed = kernel_cells().read_list()
    for name, entry in listed["notebooks"].items():
        path = REPO / "notebooks" / name
        count = sum(1 for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert entry["code_cells"] == count and all(0 <= i < count for i in entry["cells"]), name
        strict, run_only = plan(path, listed)
        assert strict == set(entry["cells"]) and not strict & run_only


def test_notebooks_pass_strict_nbval_with_portable_cpu_kernels(kernel_pass):
    if os.environ.get("DDP_LAB_KERNEL_PASS") == "child":
        pytest.skip("this is the portable-kernel pass itself")
    code, output = kernel_pass.wait()
    summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
    failed = sorted(set(re.findall(r"^FAILED (\S+)", output, re.M)))
    assert code == 0, (f"strict nbval under ATEN_CPU_CAPABILITY=default: {summary}\n"
                       + "\n".join(failed) + "\n\n" + output[-6000:])
    assert re.search(r"\d+ passed", summary), summary
