"""The launcher when the machine is against it: a cold or dead fork server, slow rank start-up.
A declared outcome must not depend on how warm the server is or how loaded the machine is."""
import os
import signal
import subprocess
import sys
import time

import pytest

import rank_bodies as body
from conftest import alive
from ddp_lab import launch
from ddp_lab.course.registry import get_scenario
from ddp_lab.launching import launcher, processes

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_a_slow_start_does_not_count_against_the_timeout():
    # Plain spawn: each rank imports torch and what DDP imports (seconds on 2 cores), far more
    # than the 1 s timeout, which counts only from when the rank is ready.
    result = launch(body.add_ranks, timeout=1, start_method="spawn")
    assert result.status == "ok", result.describe_failure()


def test_a_rank_never_ready_is_stopped_at_the_startup_limit(monkeypatch):
    monkeypatch.setattr(launcher, "STARTUP_LIMIT", 0.5)
    result = launch(body.add_ranks, timeout=1, start_method="spawn")
    assert result.status == "timeout"
    assert all("not ready 0.5 s after starting" in r.note for r in result.ranks)


def test_a_cold_fork_server_gives_the_declared_hang():
    # A fresh process, nothing prewarmed: the server is cold when the 3 s hang is launched.
    code = (f"import {processes.__name__} as processes\n"
            f"from {get_scenario.__module__} import get_scenario\n"
            "assert processes._server is None\n"
            "s = get_scenario('00', 'collective_on_one_rank')\n"
            "r = s.assert_declared('broken', s.run('broken'))\n"
            "print(r.ranks[0].stuck_in())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "all_reduce()"


def _wait_dead(pid: int) -> None:
    until = time.time() + 5
    while alive(pid) and time.time() < until:
        time.sleep(0.01)


def test_a_launch_right_after_the_server_was_killed_is_ok():
    launch(body.add_ranks)  # a server is running
    pid = processes.fork_server().proc.pid
    os.kill(pid, signal.SIGKILL)  # as the OOM killer or a user's `kill` would
    result = launch(body.add_ranks)
    assert result.status == "ok", result.describe_failure()
    assert processes.fork_server().proc.pid != pid


def test_a_server_that_died_unnoticed_is_replaced_within_the_launch(monkeypatch):
    # The server dies between the launcher's liveness check and its request: the request
    # fails at once with ServerDied (not after a 180 s wait) and the launch starts over.
    server = processes.fork_server()
    os.kill(server.proc.pid, signal.SIGKILL)
    _wait_dead(server.proc.pid)
    handed = []

    def dead_then_fresh():
        if not handed:
            handed.append(server)
            return server  # as if its death were not yet visible
        return real()

    real = processes.fork_server
    monkeypatch.setattr(processes, "fork_server", dead_then_fresh)
    start = time.time()
    result = launch(body.add_ranks)
    assert result.status == "ok", result.describe_failure()
    assert handed and time.time() - start < 60
