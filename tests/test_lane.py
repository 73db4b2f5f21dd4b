"""The lane (tests/lane.py): a child pytest runs a notebook under strict nbval, then a test file,
and each item's result comes back to this session as the item's own: passed, failed with the
child's report (nbval's for a cell), skipped."""
import os
import shutil
import tempfile

import nbformat
import pytest

from conftest import REPO
from lane import Lane, LaneFailure


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    cells = [("print(6 * 7)", "42\n", []), ("print('as committed')", "not as committed\n", []),
             ("print('skipped')", "never compared\n", ["nbval-skip"])]
    for count, (source, text, tags) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags}, execution_count=count)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    nbformat.write(nb, path)


@pytest.fixture
def folder():
    """Not tmp_path: pytest does not collect files under its own temporary folder."""
    path = tempfile.mkdtemp(prefix="ddp-lab-lane-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_each_item_comes_back_as_it_ended_in_the_lane(folder):
    path = os.path.join(folder, "lane.ipynb")
    _notebook(path)
    tests = os.path.join(folder, "test_lane_tiny.py")
    with open(tests, "w") as f:
        f.write("def test_holds():\n    assert 6 * 7 == 42\n\n\ndef test_fails():\n    assert 6 * 7 == 41\n")
    env = dict(os.environ, DDP_LAB_KERNEL_PASS="child")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    lane = Lane([path, tests], REPO, env)
    try:
        assert lane.proc.wait(120) == 1, lane.output()[-3000:]  # a cell and a test failed
        ids = [w[2] for w in lane.windows()]  # in the order they ran
        assert [i.rsplit("::", 1)[1] for i in ids] == ["Cell 0", "Cell 1", "Cell 2", "test_holds",
                                                       "test_fails"]
        cell = {i.rsplit("::", 1)[1]: i for i in ids}
        lane.replay(cell["Cell 0"])  # passed: returns
        with pytest.raises(LaneFailure, match="(?s)Cell outputs differ.*as committed"):
            lane.replay(cell["Cell 1"])
        with pytest.raises(pytest.skip.Exception):
            lane.replay(cell["Cell 2"])
        assert lane.duration(cell["Cell 0"], "call") > 0
        lane.replay(cell["test_holds"])
        with pytest.raises(LaneFailure, match=r"assert \(6 \* 7\) == 41"):
            lane.replay(cell["test_fails"])
        with pytest.raises(LaneFailure, match="exited with status 1 before this cell ran"):
            lane.replay(cell["Cell 0"] + "-never-collected")
    finally:
        lane.stop()
    assert not os.path.exists(lane.records_path)
