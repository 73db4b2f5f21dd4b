"""Where the suite's minutes and launches go, printed at the end of every session that runs
tests/ (registered by tests/conftest.py), so the budget is seen at a glance; docs/measured.md
keeps the table.

Seconds are each test's setup, call and teardown, summed per top-level folder (tests/<folder>,
the files at tests/'s top, notebooks/) and per notebook; the portable-kernel pass runs in the
background beside them, so its wall time is shown apart. Launches are `ddp_lab.launch` calls
counted by tests/run_log.py in this process and in the kernels (a kernel's launch belongs to the
notebook cell or test running when it ended). Then what was checked: scenario variants,
notebooks, exercises, corpus cases; the same counts before and after a change say nothing was
dropped. With DDP_LAB_BUDGET_OUT=FILE the table is also written to FILE, and every launch (JSON
lines, with the test or cell it belongs to) to FILE.launches.jsonl.
"""
from __future__ import annotations

import bisect
import json
import os
import re
import time
from collections import Counter

import pytest

import run_log

# what was checked: row -> (the test function's node id up to its parameters)
CHECKED = {
    "scenario variants as declared": "tests/course/test_registry.py::test_scenario_is_as_declared",
    "exercises left undone (strict nbval runs them)":
        "tests/course/test_exercises_both_ways.py::test_left_undone_is_what_strict_nbval_runs",
    "exercises solved (their cells run)": "tests/course/test_exercises_both_ways.py::test_solved_no_cell_raises",
    "watch corpus cases, broken caught": "tests/corpus/test_watch_corpus.py::test_broken_is_caught",
    "watch corpus cases, fixed clean": "tests/corpus/test_watch_corpus.py::test_fixed_has_no_error_or_warning",
    "doctor corpus cases": "tests/corpus/test_doctor_corpus.py::test_broken_is_caught_and_fixed_is_clean",
    "control set, correct runs quiet":
        "tests/corpus/test_control_set.py::test_a_correct_script_gives_no_error_or_warning",
    "control set, upstream bugs caught": "tests/corpus/test_control_set.py::test_an_upstream_bug_is_caught_at_its_line",
}
SCENARIO_LABEL = re.compile(r"^\d\d/\w+ (broken|fixed)$")


def folder_of(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    if parts[0] == "notebooks":
        return "notebooks/"
    if parts[0] == "tests" and len(parts) > 2:
        return f"tests/{parts[1]}/"
    return f"{parts[0]}/ (top-level files)"


SLOWEST = 15  # test files listed by their seconds


class Budget:
    def __init__(self, session: run_log.Session):
        self.session = session
        self.started = time.time()
        self.windows: list[tuple[float, float, str]] = []  # (start, end, nodeid), in run order
        self.seconds: Counter = Counter()  # nodeid -> setup + call + teardown
        self.outcomes: dict[str, str] = {}
        self.apart: dict[str, str] = {}  # rows shown after the table (the portable pass's)
        # origin -> the (start, end, nodeid) of a child pytest's items: its kernels' launches
        # belong to them (the lane, tests/lane.py)
        self.other_windows: dict[str, list[tuple[float, float, str]]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        run_log.current_test = item.nodeid
        start = time.time()
        yield
        self.windows.append((start, time.time(), item.nodeid))
        run_log.current_test = ""

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        if report.when == "call" or report.outcome != "passed":
            outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
            if self.outcomes.get(report.nodeid) in (None, "passed"):
                self.outcomes[report.nodeid] = outcome

    # --- what the launches were ---------------------------------------------------------------

    def owner(self, launch: dict) -> str:
        if launch["origin"] == "portable":
            return "portable pass"
        if launch["test"]:
            return launch["test"]
        windows = self.other_windows.get(launch["origin"], self.windows)
        starts = [w[0] for w in windows]
        i = bisect.bisect_right(starts, launch["t"]) - 1
        return windows[i][2] if i >= 0 and launch["t"] <= windows[i][1] + 1 else "(between tests)"

    def report(self) -> list[str]:
        launches = self.session.launches()
        owned = Counter(self.owner(x) for x in launches)
        lines = [f"Where the minutes went ({time.time() - self.started:.0f} s in all; "
                 f"load average {_load()}):", "",
                 "| folder | tests | seconds | launches |", "|---|---|---|---|"]
        lines += self._rows(folder_of, owned)
        notebooks = [n for n in self.seconds if n.startswith("notebooks/")]
        if notebooks:
            lines += ["", "| notebook (strict nbval) | cells | seconds | launches |", "|---|---|---|---|"]
            lines += self._rows(lambda n: n.split("::")[0].removeprefix("notebooks/"), owned,
                                only=notebooks)
        files = [n for n in self.seconds if not n.startswith("notebooks/")]
        if files:  # where to look next: the files, not the folders
            lines += ["", "| slowest test files | tests | seconds | launches |", "|---|---|---|---|"]
            lines += self._rows(lambda n: n.split("::")[0], owned, only=files)[:SLOWEST]
        lines += ["", *(f"{k}: {v}" for k, v in self.apart.items())]
        lines += ["", self._launch_summary(launches, owned), "", "Checked:"]
        lines += [f"  {row}: {n}" for row, n in self.checked().items()]
        return lines

    def _rows(self, key, owned: Counter, only=None) -> list[str]:
        seconds, count, launched = Counter(), Counter(), Counter()
        for nodeid in (only if only is not None else self.seconds):
            group = key(nodeid)
            seconds[group] += self.seconds[nodeid]
            count[group] += 1
            launched[group] += owned.get(nodeid, 0)
        return [f"| {g} | {count[g]} | {s:.0f} | {launched[g]} |" for g, s in seconds.most_common()]

    def _launch_summary(self, launches: list[dict], owned: Counter) -> str:
        by_origin = Counter({"pytest": "tests (this process)", "kernel": "notebook kernels",
                             "lane": "the lane (its notebooks' kernels, its tests)", "portable": "portable pass"}.get(x["origin"], x["origin"]) for x in launches)
        labels = Counter(x["label"] for x in launches
                         if x["origin"] != "portable" and SCENARIO_LABEL.match(x["label"]))
        twice = sum(n - 1 for n in labels.values() if n > 1)
        return (f"Launches: {len(launches)} ({', '.join(f'{k} {v}' for k, v in by_origin.items())}); "
                f"scenario variants launched {sum(labels.values())} times outside the portable pass, "
                f"{len(labels)} distinct, {twice} repeated")

    def checked(self) -> dict[str, str]:
        out = {}
        for row, prefix in CHECKED.items():
            got = Counter(o for n, o in self.outcomes.items() if n.split("[")[0] == prefix)
            if got:
                out[row] = _outcomes(got)
        cells = Counter(o for n, o in self.outcomes.items() if n.startswith("notebooks/"))
        if cells:
            names = {n.split("::")[0] for n in self.outcomes if n.startswith("notebooks/")}
            out["notebooks under strict nbval"] = f"{len(names)} ({sum(cells.values())} cells: {_outcomes(cells)})"
        return out

    def pytest_terminal_summary(self, terminalreporter):
        lines = self.report()
        terminalreporter.write_sep("=", "suite budget")
        for line in lines:
            terminalreporter.write_line(line)
        path = os.environ.get("DDP_LAB_BUDGET_OUT")
        if path:  # the same table, for docs/measured.md, and every launch (JSON lines) beside it
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(path + ".launches.jsonl", "w") as f:
                f.writelines(json.dumps(dict(x, owner=self.owner(x))) + "\n"
                             for x in self.session.launches())


def _outcomes(got: Counter) -> str:
    return ", ".join(f"{n} {o}" for o, n in got.most_common())


def _load() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"
