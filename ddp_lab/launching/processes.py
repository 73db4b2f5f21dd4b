"""Process handles for the launcher: ranks forked from the clean fork server, or started by plain
spawn. Both look the same to the launcher: `.pid`, `.exitcode()` (None while running, negative
for a signal) and `.kill()` of the rank's whole process group.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading

from . import forkserver, frames

# Module names only. Imported before the server takes its first request, then (while it is
# idle) what DDP imports on first use: torch._dynamo alone costs a rank ~1.5 s otherwise. A rank
# that was not forked from a warm server imports PRELOAD_IDLE itself before its clock starts.
# Callers add their own modules with `prewarm(modules=...)`; `launch` adds the launched
# function's module, so the next launch of it starts warm.
PRELOAD = ("torch", "torch.distributed", "cloudpickle", frames.CHILD)
PRELOAD_IDLE = ("torch.nn.parallel", "torch.optim", "torch._dynamo", "torch.utils.checkpoint",
                "torch.distributed.algorithms.join")


class ServerDied(RuntimeError):
    """The fork server went away (killed, out of memory) before it started a rank."""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    except OSError:
        pass


class _ForkServer:
    """Client of one fork server process, shared by every launch of this Python process."""

    def __init__(self, extra_env: dict[str, str]):
        parent, child = socket.socketpair()
        env = dict(os.environ, **extra_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", frames.FORKSERVER,
             str(child.fileno()), ",".join(PRELOAD), ",".join(PRELOAD_IDLE)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # Ctrl-C in a terminal reaches the caller, not the server
        )
        child.close()
        self.sock = parent
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.exits: dict[int, int] = {}
        self.spawned: dict[str, int] = {}
        self.alive = True
        self.preloads_sent = 0  # preload requests sent; the server answers each with "warm"
        self.warm_for = -1  # the number of preload requests the server had when last all warm
        threading.Thread(target=self._read, name="ddp-lab-forkserver", daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = forkserver.recv(self.sock)
                with self.changed:
                    if "exit" in msg:
                        self.exits[msg["exit"]] = os.waitstatus_to_exitcode(msg["status"])
                    elif "warm" in msg:
                        self.warm_for = msg["warm"]
                    else:
                        self.spawned[msg["spawned"]] = msg["pid"]
                    self.changed.notify_all()
        except Exception:  # EOF, a closed socket, or a message we cannot read: the server is gone
            with self.changed:
                self.alive = False
                self.changed.notify_all()

    @property
    def warm(self) -> bool:
        """Every module asked for so far is preloaded."""
        return self.warm_for == self.preloads_sent

    def _send(self, msg: dict) -> None:
        try:
            with self.lock:
                forkserver.send(self.sock, msg)
        except OSError as exc:
            with self.changed:
                self.alive = False
            raise ServerDied("the ddp_lab fork server has gone away") from exc

    def spawn(self, spec_path: str, timeout: float) -> "ForkedRank":
        self._send({"spawn": spec_path})
        with self.changed:
            self.changed.wait_for(lambda: spec_path in self.spawned or not self.alive, timeout)
            if spec_path in self.spawned:
                return ForkedRank(self, self.spawned.pop(spec_path))
            if not self.alive:
                raise ServerDied("the ddp_lab fork server died before it started a rank")
            raise RuntimeError(f"the ddp_lab fork server did not start a rank within {timeout:g} s "
                               "(the machine may be overloaded); run again, or pass "
                               "start_method='spawn'")

    def preload(self, modules) -> None:
        """Ask the server to import `modules` (names) when it is idle."""
        with self.changed:
            self.preloads_sent += 1
        self._send({"preload": list(modules)})

    def wait_warm(self, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.warm or not self.alive, timeout) and self.warm

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class ForkedRank:
    def __init__(self, server: _ForkServer, pid: int):
        self.server, self.pid = server, pid

    def exitcode(self) -> int | None:
        with self.server.changed:
            if self.pid in self.server.exits:
                return self.server.exits[self.pid]
            if not self.server.alive:
                return -signal.SIGKILL
            return None

    def wait_change(self, timeout: float) -> None:
        with self.server.changed:
            self.server.changed.wait(timeout)

    def kill(self) -> None:
        _kill_group(self.pid)

    def forget(self) -> None:
        with self.server.changed:
            self.server.exits.pop(self.pid, None)


class SpawnedRank:
    def __init__(self, spec_path: str, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", frames.CHILD, spec_path], env=env,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self.pid = self.proc.pid

    def exitcode(self) -> int | None:
        return self.proc.poll()

    def wait_change(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        _kill_group(self.pid)

    def forget(self) -> None:
        pass


_server: _ForkServer | None = None
_server_lock = threading.Lock()


def forkserver_available() -> bool:
    return sys.platform != "win32" and hasattr(os, "fork")


def fork_server() -> _ForkServer:
    """The shared fork server, started on first use (and again if it died)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive or _server.proc.poll() is not None:
            if _server is not None:
                _server.close()
            _server = _ForkServer({})
            if _preloads:
                _server.preload(_preloads)  # what callers asked the old one for
        return _server


_preloads: list[str] = []  # every module a caller asked to preload, for a restarted server


def prewarm(wait: bool = False, timeout: float = 120.0, modules=()) -> bool:
    """Start the fork server now (it preloads torch, then what DDP imports, then `modules`, a
    list of module names, e.g. a lesson's); with `wait`, block until it has preloaded all of
    them. Returns whether it is fully warm. Nothing depends on it: a launch on a cold server
    starts each rank's clock once that rank has imported what it needs."""
    from .rankinfo import in_torchrun

    modules = [m for m in ([modules] if isinstance(modules, str) else modules) if m not in _preloads]
    _preloads.extend(modules)
    if not forkserver_available() or in_torchrun():  # torchrun's ranks run scenarios in-process
        return False
    server = fork_server()
    if modules:
        server.preload(modules)
    return server.wait_warm(timeout) if wait else server.warm


def shutdown() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


atexit.register(shutdown)


# ---- the processes of this machine, from /proc (Linux) ---------------------------------------
# One reader for the launcher's tests and for deepspeed_ops, which must find and kill a killed
# build's compilers (ninja starts each in a process group of its own).

def _stat(pid) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first, then the parent's pid);
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pids() -> list[int]:
    """Every process id /proc lists (empty where there is no /proc)."""
    try:
        return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    return (fields := _stat(pid)) is not None and fields[0] != "Z"


def parent(pid: int) -> int | None:
    return int(fields[1]) if (fields := _stat(pid)) else None


def descendants(pid: int) -> set[int]:
    """Every live descendant of `pid`, zombies excluded."""
    children: dict[int, list[int]] = {}
    for child in pids():
        if (fields := _stat(child)) and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def working_in(folder) -> list[int]:
    """The processes whose current directory is `folder`."""
    target = os.path.realpath(folder)
    found = []
    for pid in pids():
        try:
            if os.readlink(f"/proc/{pid}/cwd") == target:
                found.append(pid)
        except OSError:
            continue
    return found
