"""How a report reads: the HTML table in JupyterLab (whose CSS right-aligns cells and centres
headers) and the stacks of a hung or failed rank (the user's frames, by file and line)."""
import re
import textwrap

import pytest
import torch
from torch import nn

import ddp_lab
from ddp_lab.doctor import Finding, Report, doctor
from ddp_lab.doctor.loader import load_target


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


def test_html_cells_carry_their_own_alignment_and_codes_do_not_break():
    report = Report("Net", 2, 3, findings=[Finding(
        "error", "unused-parameters", "01", "2 parameter(s) receive no gradient",
        ["no gradient on any rank: aux.bias, aux.weight"], "use every parameter")],
        notes=["loss: the default"])
    page = report._repr_html_()
    cells = re.findall(r"<(td|th) style='([^']*)'", page)
    assert len(cells) == 10 and all("text-align:left" in style for _, style in cells)
    assert all("color:inherit" in style for _, style in cells)  # the theme's text colour
    assert "<code style='white-space:nowrap'>unused-parameters</code>" in page
    assert "<li>loss: the default</li>" in page


HANGS = textwrap.dedent('''
    import torch
    import torch.distributed as dist
    from torch import nn

    class LogsOnRank0(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 4)

        def forward(self, x):
            y = self.lin(x)
            if dist.get_rank() == 0:
                dist.all_reduce(y.detach().mean())
            return y
''')


def test_stacks_name_the_users_file_and_fold_the_doctors_frames(tmp_path):
    path = tmp_path / "hangs.py"
    path.write_text(HANGS)
    model, _ = load_target(f"{path}:LogsOnRank0")  # shipped to the ranks by value
    report = doctor(model, torch.randn(8, 16), timeout=4)
    (f,) = report.errors
    assert f.code == "hang"
    assert 'File "hangs.py", line 14 in forward' in f.trace, f.trace
    assert "dist.all_reduce(y.detach().mean())" in f.trace
    for own in ("<dynamic-code", "doctor/trace.py", "probes.py", "doctor/sync.py", "dynamic.py"):
        assert own not in f.trace, f.trace
    assert "... (the doctor's own frames)" in f.trace
