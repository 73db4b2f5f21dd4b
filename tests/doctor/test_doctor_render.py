"""How a report reads: the HTML table in JupyterLab (whose CSS right-aligns cells and centres
headers) and the stacks of a hung or failed rank (the user's frames, by file and line)."""
import re
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import ddp_lab
from ddp_lab.doctor import Finding, Report, doctor
from ddp_lab.doctor import sync
from ddp_lab.doctor.exam import dynamic, trace
from ddp_lab.doctor.loader import load_target
from ddp_lab.instruments import probes
from ddp_lab.launching.frames import place


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
    assert "all_reduce(), called from forward() in hangs.py" in f.evidence[0]
    for own in ["<dynamic-code"] + [place(m) for m in (trace, probes, sync, dynamic)]:
        assert own not in f.trace, f.trace
    assert "... (the doctor's own frames)" in f.trace
    # every rank's stack is there, not only the first (folding does not swallow what follows)
    assert "--- stack of rank 0 ---" in f.trace and "--- stack of rank 1 ---" in f.trace, f.trace


def _jupyterlab_css() -> tuple[str, dict[str, str]]:
    """JupyterLab's own rules for rendered HTML tables, and its light and dark theme sheets."""
    import glob
    import sys

    lab = f"{sys.prefix}/share/jupyter/lab"
    bundles = glob.glob(f"{lab}/static/jlab_core.*.js")
    themes = {t: f"{lab}/themes/@jupyterlab/theme-{t}-extension/index.css" for t in ("light", "dark")}
    if not bundles or not all(Path(p).exists() for p in themes.values()):
        pytest.skip("JupyterLab's static files are not installed in this environment")
    text, rules, at = Path(bundles[0]).read_text(), [], 0
    while (at := text.find("RenderedHTMLCommon", at + 1)) > 0:  # each rule naming it, whole
        start, end = text.rfind("}", 0, at) + 1, text.find("}", at) + 1
        rule = text[start:end]
        if "{" in rule and re.search(r"\b(td|th|table|tr|thead|code|pre)\b", rule.split("{")[0]):
            rules.append(rule.replace("\\n", "\n"))
    css = "\n".join(dict.fromkeys(rules))
    return css, {t: Path(p).read_text() for t, p in themes.items()}


def test_html_table_in_jupyterlab_css_light_and_dark(browser):
    """Rendered by Chromium under JupyterLab's CSS: every cell left-aligned, codes on one line,
    text in the theme's colour. (`browser`: the session's one Chromium, tests/conftest.py.)"""
    css, themes = _jupyterlab_css()
    report = Report("Net", 2, 3, findings=[Finding(
        "error", "rank-dependent-unused-parameters", "01", "different parameters go unused",
        ["rank 0: a.weight", "rank 1: b.weight"], "find_unused_parameters=True")])
    for theme, sheet in themes.items():
        page = browser.new_page(viewport={"width": 700, "height": 500})
        page.set_content(f"<style>{sheet}\n{css}</style><body class='jp-ThemedContainer'>"
                         f"<div class='jp-RenderedHTMLCommon jp-OutputArea-output'>"
                         f"{report._repr_html_()}</div></body>")
        aligns = page.eval_on_selector_all(
            "td, th", "els => els.map(e => getComputedStyle(e).textAlign)")
        assert aligns and set(aligns) == {"left"}, (theme, aligns)
        code = page.eval_on_selector("code", "e => [e.getClientRects().length, e.offsetHeight,"
                                              " parseFloat(getComputedStyle(e).lineHeight)]")
        assert code[0] == 1 and code[1] < 2 * code[2], (theme, code)  # one line, unbroken
        colours = page.eval_on_selector_all(
            "td", "els => els.map(e => getComputedStyle(e).color)")
        body = page.evaluate("getComputedStyle(document.querySelector('table')).color")
        assert set(colours) == {body}, (theme, colours, body)
        page.close()
