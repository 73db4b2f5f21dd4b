import os
import time

import pytest


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc), zombies excluded."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def no_leftovers():
    """Fails the test if a process started during it (other than the shared fork server) is
    still alive afterwards."""
    from ddp_lab import _procs

    def server_pid():
        return _procs._server.proc.pid if _procs._server is not None else None

    before = descendants(os.getpid())
    yield
    deadline = time.time() + 3
    while True:
        extra = descendants(os.getpid()) - before - {server_pid()}
        if not extra or time.time() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"processes left behind: {sorted(extra)}"


_SCENARIO_RUNS: dict = {}


def scenario_run(scenario, which: str):
    """Each scenario variant runs once per test session: the registry test and the lesson tests
    that read the same run share it (the suite has a 10-minute budget on 2 cores)."""
    key = (scenario.key, which)
    if key not in _SCENARIO_RUNS:
        _SCENARIO_RUNS[key] = scenario.run(which)
    return _SCENARIO_RUNS[key]


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
