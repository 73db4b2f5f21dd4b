"""The lane: the notebooks' strict nbval pass, then the test files that mostly wait
(conftest.LANE_TESTS), in a child pytest beside the rest of the suite.

Measured on the 2-core machine (docs/measured.md, issue 46): one pytest process kept 1.2 cores
busy on average, 1.06 while it ran the notebooks: a cell waits on its kernel, the kernel on its
ranks, and many tests wait on ranks that hang on purpose. So when a session runs the notebooks and other tests, a child pytest
(`Lane`) starts as soon as collection ends with the same options (pyproject's: strict `--nbval`,
the sanitizer, the current environment) and runs the notebooks, then LANE_TESTS, while this
process runs the other tests. Each of the lane's items stays an item of this session: its run
waits for the child's record of it and replays it (passed, failed with the child's own report,
skipped, xfailed), so per-item results, `--durations` (the child's seconds) and the budget's
table read as if it had run here. The tests that read the notebooks' runs come after the
notebooks' cells, as before, so they read runs the lane's kernels kept (tests/run_log.py: the
kernels inherit the session's folder); the lane's launches are logged with origin "lane".

The child loads this file as a plugin (`-p lane`) and appends one JSON line per item to
$DDP_LAB_LANE_RECORDS when the item is done: its phases' outcomes, seconds and reports, and its
start and end (whose launches were whose, for the budget).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

RECORDS_VAR = "DDP_LAB_LANE_RECORDS"
WAIT_LIMIT = 1800  # s for one cell's record: nbval's own per-cell timeout is longer than any cell


# --- In the child: one record per item --------------------------------------------------------

_phases: dict[str, dict] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import run_log

    run_log.current_test, start = item.nodeid, time.time()  # the owner of the item's launches
    yield
    run_log.current_test = ""
    record = {"nodeid": item.nodeid, "start": start, "end": time.time(),
              "phases": _phases.pop(item.nodeid, {})}
    with open(os.environ[RECORDS_VAR], "a") as f:  # one line, appended whole
        f.write(json.dumps(record) + "\n")


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]  # (file, line, reason)
    else:
        text = str(report.longrepr) if report.longrepr else ""
    _phases.setdefault(report.nodeid, {})[report.when] = {
        "outcome": report.outcome, "duration": report.duration, "text": text,
        "wasxfail": getattr(report, "wasxfail", None)}


# --- In the session: start the child, replay its records --------------------------------------

class LaneFailure(Exception):
    """A cell failed in the lane: `text` is the report the child's pytest made of it."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class Lane:
    def __init__(self, files: list[str], repo, env: dict):
        fd, self.records_path = tempfile.mkstemp(prefix="ddp-lab-lane-", suffix=".jsonl")
        os.close(fd)
        self.log = tempfile.TemporaryFile(mode="w+")
        self.records: dict[str, dict] = {}
        self._offset = 0
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "lane",
             # the repository's options (strict nbval...) wherever the files are
             "-c", os.path.join(repo, "pyproject.toml"), "--rootdir", str(repo), *files],
            cwd=repo, env=dict(env, **{RECORDS_VAR: self.records_path}),
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.ended = None
        threading.Thread(target=self._ended, daemon=True).start()

    def _ended(self) -> None:
        self.proc.wait()
        self.ended = time.time()

    def seconds(self) -> float:
        return (self.ended or time.time()) - self.started

    def adopt(self, item) -> None:
        """Make `item` replay the lane's record of it: nothing of it runs here (no fixture, and
        for a notebook's cell no kernel)."""
        if hasattr(item.parent, "kernel"):  # nbval's notebook: it starts the kernel
            item.parent.setup = item.parent.teardown = lambda: None
        item.setup = lambda: None
        item.runtest = lambda: self.replay(item.nodeid)
        own_repr = item.repr_failure
        item.repr_failure = lambda excinfo, *a, **k: (
            excinfo.value.text if isinstance(excinfo.value, LaneFailure) else own_repr(excinfo, *a, **k))
        item.lane = self

    def _read(self) -> None:
        with open(self.records_path) as f:
            f.seek(self._offset)
            while True:
                line = f.readline()
                if not line.endswith("\n"):  # not whole yet: read it next time
                    break
                self._offset += len(line.encode())
                record = json.loads(line)
                self.records[record["nodeid"]] = record

    def record(self, nodeid: str) -> dict | None:
        """The child's record of `nodeid`, once it is written; None if the child ended without."""
        deadline = time.time() + WAIT_LIMIT
        while time.time() < deadline:
            self._read()
            if nodeid in self.records:
                return self.records[nodeid]
            if self.proc.poll() is not None:
                self._read()
                return self.records.get(nodeid)
            time.sleep(0.05)
        raise LaneFailure(f"no record of {nodeid} from the lane after {WAIT_LIMIT} s")

    def replay(self, nodeid: str) -> None:
        record = self.record(nodeid)
        if record is None:
            raise LaneFailure(f"the lane (a child pytest) exited with status "
                              f"{self.proc.returncode} before this cell ran:\n{self.output()[-4000:]}")
        phases = record["phases"]
        failed = [f"[{when}] {p['text']}" for when, p in phases.items() if p["outcome"] == "failed"]
        if failed:
            raise LaneFailure("\n".join(failed))
        done = phases.get("call") or phases.get("setup") or {}
        if done.get("wasxfail") is not None:
            pytest.xfail(done["wasxfail"])
        if done.get("outcome") == "skipped":
            pytest.skip(done["text"] or "skipped in the lane")

    def duration(self, nodeid: str, when: str) -> float | None:
        phase = self.records.get(nodeid, {}).get("phases", {}).get(when)
        return phase["duration"] if phase else None

    def windows(self) -> list[tuple[float, float, str]]:
        self._read()
        return sorted((r["start"], r["end"], r["nodeid"]) for r in self.records.values())

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its kernels and ranks with it
            self.proc.wait()
        try:
            os.unlink(self.records_path)
        except OSError:
            pass


class LaneReports:
    """A plugin of the session: an item the lane ran reports the lane's seconds, not this
    process's wait for them (--durations, the budget's table)."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        lane = getattr(item, "lane", None)
        if lane is not None:
            outcome.get_result().duration = lane.duration(item.nodeid, call.when) or 0.0
