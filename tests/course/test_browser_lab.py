"""The notebooks in JupyterLab, driven in a real headless Chromium (tests/chromium.py): a lesson
opens unmodified, its panel runs a scenario on real ranks when the button is clicked, and the
stop button during a launch leaves no rank process. JupyterLab serves copies in a temporary
folder, so nothing here can save over the committed notebooks."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from conftest import REPO as ROOT, alive, descendants
from ddp_lab.launching import launcher

LESSON = "01_parameter_registration.ipynb"  # its panel needs only the first cell run
STOP_CELL = '''import os, time, ddp_lab

def sleeper(folder):
    import os, time, torch.distributed as dist
    print("started", flush=True)
    path = os.path.join(folder, "rank%d.pid" % dist.get_rank())
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(60)

ddp_lab.launch(sleeper, {folder!r}, world_size=2, timeout=60)'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"JupyterLab did not answer at {url} within {seconds} s")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free port over a temporary folder; stopped by its PID."""
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / LESSON, root / LESSON)
    (root / "pids").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell(STOP_CELL.format(folder=str(root / "pids")))],
                                metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                                         "language": "python"}}), root / "stop.ipynb")
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--ServerApp.root_dir={root}", "--IdentityProvider.token=", "--ServerApp.password=",
           f"--LabApp.workspaces_dir={root / '.ws'}", "--LabApp.news_url=None",
           "--ServerApp.disable_check_xsrf=True"]  # the tests POST to its REST API
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # JupyterLab refuses to run as root without it
    env = dict(os.environ, PYTHONPATH=str(ROOT), JUPYTER_CONFIG_DIR=str(root / ".config"))
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(f"http://127.0.0.1:{port}/api/status", 60)
        yield f"http://127.0.0.1:{port}", root
    finally:
        children = descendants(server.pid)
        server.terminate()  # JupyterLab shuts its kernels down on SIGTERM
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        for pid in children:
            if alive(pid):
                os.kill(pid, 9)


def _open(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url + "?reset")  # a fresh workspace: only this notebook open
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.wait_for_selector("text=/Python 3 \\(ipykernel\\) \\| Idle/", timeout=90_000)  # the status bar
    return page


def _run_cell(page, cell) -> None:
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def test_a_lesson_opens_unmodified_and_its_panel_runs_real_ranks(lab, browser):
    url, root = lab
    page = _open(browser, f"{url}/lab/tree/{LESSON}")
    # JupyterLab rewrites a kernelspec it disagrees with when the kernel connects, before the
    # status bar says Idle: a copy saying "Python 3" is already marked modified here (checked).
    page.screenshot(path=str(root / "opened.png"))
    assert page.locator(".lm-TabBar-tab.jp-mod-dirty").count() == 0, "the notebook opened marked modified"
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    _run_cell(page, notebook.locator(".jp-CodeCell").first)  # the imports and `lesson`
    panel_cell = notebook.locator('.jp-CodeCell:has-text("scenario_panel(lesson")').first
    _run_cell(page, panel_cell)
    button = panel_cell.locator('button:has-text("run on real ranks")')
    button.wait_for(timeout=60_000)
    button.click()
    output = panel_cell.locator(".widget-output")  # the panel's Output widget
    output.locator("text=/01\\/\\w+ broken: error \\(as declared\\)/").wait_for(timeout=90_000)
    assert output.locator("text=RunResult").count() == 1  # the per-rank table, inside the widget
    page.screenshot(path=str(root / "panel.png"))
    page.close()


def _share_a_running_kernel(url: str, path: str) -> None:
    """Open `path` on the kernel another notebook of this server already runs (torch and
    ddp_lab imported, the fork server warm), when there is one: it saves a kernel start."""
    sessions = json.loads(urllib.request.urlopen(f"{url}/api/sessions", timeout=10).read())
    if not sessions:
        return
    body = json.dumps({"path": path, "name": path, "type": "notebook",
                       "kernel": {"id": sessions[0]["kernel"]["id"]}}).encode()
    urllib.request.urlopen(urllib.request.Request(
        f"{url}/api/sessions", data=body, method="POST",
        headers={"Content-Type": "application/json"}), timeout=10).read()


def test_the_stop_button_during_a_launch_leaves_no_rank(lab, browser):
    url, root = lab
    _share_a_running_kernel(url, "stop.ipynb")
    page = _open(browser, f"{url}/lab/tree/stop.ipynb")
    _run_cell(page, page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell").first)
    pid_files = [root / "pids" / f"rank{r}.pid" for r in (0, 1)]
    end = time.time() + 60
    while not all(p.exists() and p.read_text() for p in pid_files):
        assert time.time() < end, "the ranks never started"
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in pid_files]
    assert all(alive(pid) for pid in pids)
    page.click('[data-command="notebook:interrupt-kernel"]')
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=30_000)
    end = time.time() + 10
    while any(alive(pid) for pid in pids) and time.time() < end:
        time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)], "a rank outlived the stop button"
    # What the cell shows: the ranks' output and stacks so far, and one line, no traceback
    output = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea").first
    output.locator("text=/LaunchInterrupted: interrupted/").wait_for(timeout=10_000)
    shown = output.inner_text()
    assert "[rank 0] started" in shown and "rank 1 was stopped in:" in shown
    assert os.path.basename(launcher.__file__) not in shown and "Traceback" not in shown
    page.screenshot(path=str(root / "stop.png"))
    page.close()
