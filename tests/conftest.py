import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

import run_log
from suite_budget import Budget

REPO = Path(__file__).resolve().parent.parent  # the repository: tests/ may have subfolders
WATCH_CORPUS = REPO / "tests" / "corpus" / "watch"


def corpus_score():
    """tools/corpus_score.py, loaded once (the corpus tests and the checks' tests share it)."""
    import importlib.util

    if "corpus_score" not in sys.modules:
        spec = importlib.util.spec_from_file_location("corpus_score", REPO / "tools" / "corpus_score.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    module = sys.modules["corpus_score"]
    if _notebook_watch_report not in module.MADE_ELSEWHERE:  # a notebook's run of a corpus script
        module.MADE_ELSEWHERE.append(_notebook_watch_report)
    return module


def _notebook_watch_report(script: str, args, nproc: int, timeout: float, reference=None):
    if _suite is None:
        return None
    return _suite.notebook_watch_report(script, args, nproc, timeout, reference)


def corpus_report(path):
    """watch (every check) on a script of the watch corpus, run once per session and shared by
    tests/corpus/test_watch_corpus.py and each check's tests; None for a script elsewhere."""
    path = Path(path).resolve()
    if WATCH_CORPUS not in path.parents:
        return None
    return corpus_score().watch_report(str(path))

# One reader of /proc, the launcher's; tests import alive and descendants from here.
from ddp_lab.launching.processes import alive, descendants, parent as _parent  # noqa: F401


def _described(pid: int) -> str:
    """`pid (command line) <- parent (its command line)`: what a leftover is, for the report."""
    def cmd(p):
        try:
            with open(f"/proc/{p}/cmdline") as f:
                return f.read().replace("\0", " ").strip()[:160] or "?"
        except OSError:
            return "gone"

    parent = _parent(pid)
    if parent is None:
        return f"{pid} (gone)"
    return f"{pid} ({cmd(pid)}) <- {parent} ({cmd(parent)})"


@pytest.fixture
def no_leftovers():
    """Fails the test if a process started during it (other than the shared fork server) is
    still alive afterwards."""
    from ddp_lab.launching import processes

    def server_pid():
        return processes._server.proc.pid if processes._server is not None else None

    before = descendants(os.getpid())
    yield
    deadline = time.time() + 3
    while True:
        extra = (descendants(os.getpid()) - before - {server_pid()} - _background_tree()
                 - _browser_tree())
        if not extra or time.time() > deadline:
            break
        time.sleep(0.05)
    assert not extra, "processes left behind: " + "; ".join(_described(p) for p in sorted(extra))


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this process for the test: what Jupyter's stop button
    and Ctrl-C rely on. A shell starts a background job with SIGINT ignored (`cmd &` without job
    control, nohup), and Python then keeps it ignored: a CI runner that starts pytest that way
    would see no interrupt at all, as a clean-clone run started with `( .ci/run & )` did."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test of the session (tests/chromium.py); the
    tests skip, saying why, where there is none. Like the fork server it is shared, so the
    processes Chromium starts later (renderers, utilities) are not a later test's leftovers."""
    from chromium import chromium_browser

    before = descendants(os.getpid())
    with chromium_browser() as b:
        _browser_roots.update(p for p in descendants(os.getpid()) - before
                              if _parent(p) == os.getpid())  # Playwright's driver
        yield b
    _browser_roots.clear()


_browser_roots: set[int] = set()


def _tree(roots) -> set[int]:
    """`roots` and every live descendant of them."""
    return set(roots).union(*(descendants(r) for r in roots))


def _browser_tree() -> set[int]:
    """The session's Chromium and everything it started."""
    return _tree(_browser_roots)


# --- The session's record: launches counted in every process, minutes per folder ---------------
_suite: run_log.Session | None = None


def pytest_configure(config):
    """The launch log and the kernels' start-up file exist before anything launches (the
    portable pass's kernels inherit them); the budget's table prints at the end."""
    global _suite
    if os.environ.get("DDP_LAB_KERNEL_PASS") == "child" and os.environ.get(run_log.ORIGIN_VAR) == "lane":
        run_log.install("lane")  # the lane's own launches count too (its kernels' install themselves)
    if os.environ.get("DDP_LAB_KERNEL_PASS") == "child" or _suite is not None:
        return
    _suite = run_log.Session()
    config.pluginmanager.register(Budget(_suite), "suite_budget")


def pytest_unconfigure(config):
    global _suite
    if _suite is not None:
        _suite.close()
        _suite = None


_SCENARIO_RUNS: dict = {}  # (scenario key, variant) -> (RunResult, leftovers, the notebook's)
# The tests that read scenario runs or corpus reports: they run after the notebooks, whose runs
# they reuse (notebook 11 runs watch on a corpus script).
SHARED_RUN_READERS = ("tests/course/test_registry.py", "tests/lessons/", "tests/corpus/",
                      "tests/doctor/checks/", "tests/test_readme_commands.py")


_PREPARED: set = set()


def _scenario_run(scenario, which: str) -> tuple:
    key = (scenario.key, which)
    if key not in _SCENARIO_RUNS:
        _prepare(scenario.lesson)
        kept = _suite.notebook_run(*key) if _suite is not None else None
        if kept and any(os.environ.get(k) != v for k, v in kept["env"].items()):
            kept = None  # the notebook had set variables this process has not: another launch
        _SCENARIO_RUNS[key] = ((kept["result"], kept["leftovers"], True) if kept
                               else (scenario.run(which), [], False))
    return _SCENARIO_RUNS[key]


def _prepare(lesson_id: str) -> None:
    """The lesson's `prepare()`, once, before its first scenario runs here: as the tour and the
    notebooks run them (lesson 12 names DeepSpeed's accelerator, 15 and 16 warm the fork server)."""
    if lesson_id not in _PREPARED:
        from ddp_lab.course.registry import get_lesson

        _PREPARED.add(lesson_id)
        lesson = get_lesson(lesson_id)
        if lesson.prepare is not None:
            lesson.prepare()


def scenario_run(scenario, which: str):
    """Each scenario variant runs once per test session: the registry test and the lesson tests
    that read the same run share it (the suite has a 15-minute budget on 2 cores). Where the
    scenario's notebook made the same launch earlier in the session (`scenario.run(which)`, no
    argument changed, and any variable the notebook set has the same value here, so the ranks
    get the same environment: tests/run_log.py keeps it), that run is the one; the tests that
    read runs go after the notebooks (SHARED_RUN_READERS)."""
    return _scenario_run(scenario, which)[0]


def scenario_run_leftovers(scenario, which: str) -> list[str] | None:
    """For a notebook's run, the processes it left behind (its kernel looked, as no_leftovers
    looks here); None for a run made in this process, which no_leftovers checks."""
    _, leftovers, kept = _scenario_run(scenario, which)
    return leftovers if kept else None


@pytest.fixture(scope="module")
def runs(request):
    """`runs(name, which)`: the test module's LESSON's scenario, run once per session and
    checked against its declaration."""
    lesson = request.module.LESSON

    def get(name: str, which: str):
        scenario = lesson.scenario(name)
        result = scenario_run(scenario, which)
        scenario.assert_declared(which, result)
        return result
    return get


# --- The notebooks' kernel-dependent cells once more, under the portable CPU kernels ------------
# PyTorch picks CPU kernels by instruction set, so a printed figure can differ in its last digit
# on a learner's laptop. The cells whose outputs can depend on them (tests/kernel_cells.json,
# measured by tools/kernel_cells.py under default, avx2 and this CPU's kernels) run a second
# time under strict nbval with ATEN_CPU_CAPABILITY=default (the portable kernels), with the cells
# they need (tests/portable_cells.py), so such a figure fails here first. When the session runs
# the notebooks too, that second pass starts in the background as soon as collection ends and
# `test_notebooks_portable.py` waits for it at the very end; alone, that test runs it in the
# foreground.
KERNEL_PASS_ENV = {"ATEN_CPU_CAPABILITY": "default"}
_KERNEL_PASS_TEST = "test_notebooks_portable.py::test_notebooks_pass_strict_nbval_with_portable_cpu_kernels"
# After every other test, in this order: the corpus-runs check reads the whole session's launches
LAST = ("test_corpus_runs_once.py::test_no_corpus_script_is_launched_twice", _KERNEL_PASS_TEST)
_kernel_pass = None


class KernelPass:
    """A strict nbval run of the notebooks' listed cells in a child pytest, under KERNEL_PASS_ENV."""

    def __init__(self, notebooks: list[str]):
        import subprocess
        import sys
        import tempfile

        self.log = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, **KERNEL_PASS_ENV, DDP_LAB_KERNEL_PASS="child",
                   **{run_log.ORIGIN_VAR: "portable"})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
        self.started, self.seconds, self.summary = time.time(), None, ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "portable_cells",
             *notebooks],
            cwd=REPO, env=env,
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        threading.Thread(target=self._ended, daemon=True).start()

    def _ended(self) -> None:
        """Its own wall time, from start to exit (the session waits for it only at the end)."""
        self.proc.wait()
        self.seconds = time.time() - self.started

    def wait(self, timeout: float = 900) -> tuple[int, str]:
        self.proc.wait(timeout)
        self.seconds = self.seconds or time.time() - self.started
        self.log.seek(0)
        output = self.log.read()
        self.summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        return self.proc.returncode, output

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its kernels and ranks with it
            self.proc.wait()


def _background_tree() -> set[int]:
    """The background passes (the portable one, the lane) and everything they started:
    not a test's leftovers."""
    return _tree([p.proc.pid for p in (_kernel_pass, _lane) if p is not None])


def notebook_paths() -> list[str]:
    import glob

    root = str(REPO)
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "notebooks", "*.ipynb")))


def pytest_collection_modifyitems(session, config, items):
    """The tests that read scenario runs go after the notebooks (they reuse the notebooks'
    runs), the corpus-runs check and the portable-kernel check last (LAST); when the notebooks
    run in this session too, the portable pass starts now, in the background."""
    global _kernel_pass, _lane
    if os.environ.get("DDP_LAB_KERNEL_PASS") == "child":
        return
    notebooks = [i for i, it in enumerate(items) if it.nodeid.startswith("notebooks/")]
    lane_tests = [it for it in items if it.nodeid.startswith(LANE_TESTS)]
    if notebooks and len(notebooks) + len(lane_tests) < len(items) and os.environ.get(LANE_VAR) != "0" \
            and not config.option.keyword and not config.option.markexpr and not config.option.collectonly:
        _lane = _start_lane(config, [items[i] for i in notebooks] + lane_tests)
    else:
        lane_tests = []
    if notebooks:
        before, after = items[:notebooks[-1] + 1], items[notebooks[-1] + 1:]
        readers = [it for it in before if it.nodeid.startswith(SHARED_RUN_READERS)]
        items[:] = [it for it in before if not it.nodeid.startswith(SHARED_RUN_READERS)] + readers + after
    last = sorted((it for it in items if it.nodeid.endswith(LAST)),
                  key=lambda it: [it.nodeid.endswith(t) for t in LAST].index(True))
    moved = {id(it) for it in last + lane_tests}  # the lane's tests replayed after the readers
    items[:] = [it for it in items if id(it) not in moved] + lane_tests + last
    if notebooks and any(it.nodeid.endswith(_KERNEL_PASS_TEST) for it in last) \
            and not config.option.collectonly:
        _kernel_pass = KernelPass(notebook_paths())


def pytest_sessionfinish(session, exitstatus):
    budget = session.config.pluginmanager.get_plugin("suite_budget")
    if _lane is not None:
        if budget is not None:
            budget.other_windows["lane"] = _lane.windows()
            budget.apart[f"the lane (the notebooks, then {', '.join(LANE_TESTS)}; beside the rest)"] = (
                f"{_lane.seconds():.0f} s start to exit, {len(_lane.records)} items")
        _lane.stop()
    if _kernel_pass is not None:
        _kernel_pass.stop()
        if budget is not None and _kernel_pass.seconds is not None:
            budget.apart["portable-kernel pass (in the background, start to exit)"] = (
                f"{_kernel_pass.seconds:.0f} s: {_kernel_pass.summary}")
    if budget is not None and _SCENARIO_RUNS:
        shared = sum(1 for _, _, kept in _SCENARIO_RUNS.values() if kept)
        budget.apart["scenario variants the tests read"] = (
            f"{len(_SCENARIO_RUNS)}: {shared} a notebook's run, {len(_SCENARIO_RUNS) - shared} launched here")


# --- The notebooks' strict nbval pass, and tests that mostly wait, beside the rest ---------------
# (tests/lane.py). One pytest process kept 1.2 of the 2 cores busy (docs/measured.md): the
# lane runs the notebooks, then these files (ranks that hang on purpose, launches waited out:
# 0.5-0.6 cores busy alone), while this process runs the other tests, then the tests that read
# the notebooks' runs; the lane's tests are replayed after those.
LANE_VAR = "DDP_LAB_LANE"  # "0": everything runs in this process, one test after the other
LANE_TESTS = ("tests/launching/", "tests/doctor/watch/test_script_run.py")
_lane = None


def _start_lane(config, items: list):
    from lane import Lane, LaneReports

    env = dict(os.environ, DDP_LAB_KERNEL_PASS="child", **{run_log.ORIGIN_VAR: "lane"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    files = list(dict.fromkeys(str(it.path) for it in items))
    lane = Lane(files, REPO, env)
    for item in items:
        lane.adopt(item)
    config.pluginmanager.register(LaneReports(), "lane_reports")
    return lane


@pytest.fixture
def kernel_pass():
    """The background pass when this session started one, else a new one (run in the foreground)."""
    return _kernel_pass or KernelPass(notebook_paths())
