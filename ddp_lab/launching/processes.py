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
import warnings

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


class ForkServerPoisoned(RuntimeWarning):
    """A module imported into the fork server initialised CUDA there; the server was replaced
    by one without it."""


def _kill_group(pid: int) -> None:
    _signal_group(pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:  # gone already (ProcessLookupError), or not ours
        pass


def stopped(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP) or gone; where /proc cannot say (not Linux), True."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"T", b"t", b"Z", b"X")


def freeze(pids, until: float) -> None:
    """SIGSTOP each process group in `pids` and wait (until the time `until`) for each leader to
    be stopped. The launcher freezes every hung rank before it kills any: a rank still running
    when its peer dies sees the peer's socket close and writes gloo's "Connection closed by peer"
    traceback, or not, by timing (a notebook's output then differs from run to run)."""
    import time

    pids = list(pids)
    for pid in pids:
        _signal_group(pid, signal.SIGSTOP)
    while not all(stopped(pid) for pid in pids) and time.time() < until:
        time.sleep(0.002)


class _ForkServer:
    """Client of one fork server process, shared by every launch of this Python process."""

    def __init__(self, extra_env: dict[str, str]):
        parent, child = socket.socketpair()
        env = dict(os.environ, **extra_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        now, idle = ([m for m in names if m not in _excluded] for names in (PRELOAD, PRELOAD_IDLE))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", frames.FORKSERVER,
             str(child.fileno()), ",".join(now), ",".join(idle)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # Ctrl-C in a terminal reaches the caller, not the server
        )
        child.close()
        self.sock = parent
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.exits: dict[int, int] = {}
        self.spawned: dict[str, int] = {}
        self.refused: set[str] = set()
        self.poisoned: tuple[str, str] | None = None  # (module, what initialised CUDA)
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
                    elif "poisoned" in msg:
                        self.poisoned = (msg["poisoned"], msg["by"])
                    elif "refused" in msg:
                        self.refused.add(msg["refused"])
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
            self.changed.wait_for(lambda: spec_path in self.spawned or not self.alive
                                  or spec_path in self.refused, timeout)
            if spec_path in self.spawned:
                return ForkedRank(self, self.spawned.pop(spec_path))
            if spec_path in self.refused:
                raise ServerDied("the ddp_lab fork server refused to fork: an import initialised "
                                 "CUDA in it")
            if not self.alive:
                raise ServerDied("the ddp_lab fork server died before it started a rank")
            raise RuntimeError(f"the ddp_lab fork server did not start a rank within {timeout:g} s "
                               "(the machine may be overloaded); run again, or pass "
                               "start_method='spawn'")

    def preload(self, modules, env=None) -> None:
        """Ask the server to import `modules` (names) when it is idle, with `env` set first."""
        with self.changed:
            self.preloads_sent += 1
        self._send({"preload": list(modules), "env": dict(env or {})})

    def wait_warm(self, timeout: float) -> bool:
        with self.changed:
            done = lambda: self.warm or not self.alive or self.poisoned  # noqa: E731
            return bool(self.changed.wait_for(done, timeout)) and self.warm and not self.poisoned

    def close(self) -> None:
        try:
            # shutdown, not only close: the reader thread blocked in recv() keeps the socket open
            # after close(), so the server never saw EOF and every `ddp-lab run` waited the 5 s
            # below before killing it (measured: 5.00 s; 0.26 s with shutdown)
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
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


# A spawned rank imports the package's child module and runs it. Not `python -m CHILD`: runpy would
# execute a second copy of the module as `__main__` (the package's __init__ has imported the
# first) and warn about it on the rank's stderr, in every notebook output that shows it.
_SPAWN = "import importlib, sys; importlib.import_module(sys.argv[1]).child_main(sys.argv[2])"


class SpawnedRank:
    def __init__(self, spec_path: str, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SPAWN, frames.CHILD, spec_path], env=env,
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
_retired: list[_ForkServer] = []  # poisoned servers whose ranks still run; closed once they exit
_excluded: set[str] = set()  # modules that initialised CUDA in a fork server: never preloaded


def forkserver_available() -> bool:
    return sys.platform != "win32" and hasattr(os, "fork")


def fork_server() -> _ForkServer:
    """The shared fork server, started on first use (and again if it died)."""
    global _server
    with _server_lock:
        if _server is not None and _server.poisoned:
            _exclude(*_server.poisoned)
            _retired.append(_server)  # not closed: that would kill the ranks it forked before
            _server = None
        if _server is None or not _server.alive or _server.proc.poll() is not None:
            if _server is not None:
                _server.close()
            _close_retired()
            _server = _ForkServer(_preload_env)
            if _preloads:
                _server.preload(_preloads)  # what callers asked the old one for
        return _server


_preloads: list[str] = []  # every module a caller asked to preload, for a restarted server
_preload_env: dict[str, str] = {}  # variables those modules read at import (prewarm's env)


def _exclude(module: str, by: str) -> None:
    """Never preload `module` again, and say why: it initialised CUDA in the fork server."""
    _excluded.add(module)
    if module in _preloads:
        _preloads.remove(module)
    warnings.warn(poisoned_message(module, by), ForkServerPoisoned, stacklevel=4)


def poisoned_message(module: str, by: str) -> str:
    return (f"ddp_lab: importing {module} initialised CUDA in the fork server "
            f"({by or 'from C++, not through torch.cuda'}). Every rank forked after that would "
            "fail on CUDA with 'Cannot re-initialize CUDA in forked subprocess', so none was: a "
            f"new fork server runs without {module}, and each rank imports it itself. To keep it "
            "preloadable, ask for CUDA inside the functions the ranks run, or count GPUs without "
            f"initialising CUDA ({__name__.rpartition('.')[0]}.cuda_init.gpu_count()).")


def _close_retired() -> None:
    for old in [s for s in _retired if s.proc.poll() is not None or not s.alive]:
        old.close()
        _retired.remove(old)


def prewarm(wait: bool = False, timeout: float = 120.0, modules=(), env=None) -> bool:
    """Start the fork server now (it preloads torch, then what DDP imports, then `modules`, a
    list of module names, e.g. a lesson's, with the environment variables `env` set first for
    the imports that read them); with `wait`, block until it has preloaded all of them. Returns
    whether it is fully warm. Nothing depends on it: a launch on a cold server starts each
    rank's clock once that rank has imported what it needs. A module that initialises CUDA at
    import is not kept in the server (a `ForkServerPoisoned` warning names it)."""
    from .rankinfo import in_torchrun

    modules = [m for m in ([modules] if isinstance(modules, str) else modules)
               if m not in _preloads and m not in _excluded]
    _preloads.extend(modules)
    _preload_env.update({str(k): str(v) for k, v in (env or {}).items()})
    if not forkserver_available() or in_torchrun():  # torchrun's ranks run scenarios in-process
        return False
    server = fork_server()
    if modules or env:
        server.preload(modules, env)
    for _ in range(len(PRELOAD) + len(PRELOAD_IDLE) + len(_preloads) + 1):
        if not wait:
            return server.warm
        if server.wait_warm(timeout) or not server.poisoned:
            return server.warm and not server.poisoned
        server = fork_server()  # a module initialised CUDA there: a new server, without it
    return False


def shutdown() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None
        for old in _retired:
            old.close()
        _retired.clear()


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
