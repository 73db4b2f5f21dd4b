"""A clean fork server: started once (by exec, never by forking the caller), it imports torch and
torch.distributed, then forks one child per rank on request, so a rank starts in milliseconds
with nothing of the notebook's state.

Protocol over a socketpair, length-prefixed pickles:
  client -> server  {"spawn": spec_path}          server -> client  {"spawned": spec_path, "pid": pid}
  client -> server  {"preload": [module names],   server -> client  {"exit": pid, "status": waitstatus}
                     "env": {name: value}}        server -> client  {"warm": n} (all preloaded, after
                                                                      n preload requests)
                                                   server -> client  {"poisoned": module, "by": text}
                                                   server -> client  {"refused": spec_path}
The server knows nothing of what it preloads beyond module names (and the environment variables
they read at import): its callers choose them.
The server exits when the client's end closes (its parent died or it shut the server down), and
kills the process groups of the children it still has. Once an import has initialised CUDA in
it (on a CUDA build of torch, `torch.cuda.is_available()` at import time is enough), every rank
forked after that would be unable to use CUDA: the server says {"poisoned": ...}, refuses every
later spawn, preloads nothing more, and exits when the ranks it already forked (before the
import, so unharmed) have exited. Its client starts a new server without that module (`processes`).
"""
from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import struct
import sys

_HEADER = struct.Struct("!I")


def send(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv(sock: socket.socket):
    header = _recv_exact(sock, _HEADER.size)
    return pickle.loads(_recv_exact(sock, _HEADER.unpack(header)[0]))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("fork server connection closed")
        buf += chunk
    return buf


def _fork_rank(sock: socket.socket, wakeup_r: int, spec_path: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            sock.close()
            os.close(wakeup_r)
            from . import cuda_init
            from .child import child_main

            cuda_init.unwatch()  # the rank gets torch's own functions back

            child_main(spec_path)
        finally:
            os._exit(70)
    return pid


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        send(sock, {"exit": pid, "status": status})


def serve(sock: socket.socket, later=()) -> None:
    wakeup_r, wakeup_w = os.pipe()
    os.set_blocking(wakeup_w, False)
    signal.set_wakeup_fd(wakeup_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wakeup_r, selectors.EVENT_READ)
    later = list(later)
    requests = 0  # preload requests received
    poisoned = False  # an import initialised CUDA here: fork nothing more
    if not later:
        send(sock, {"warm": requests})
    try:
        while True:
            events = sel.select(timeout=0.05 if later else None)
            if not events and later:
                try:
                    _preload(later.pop(0), sock)  # idle: warm one more module, between requests
                except _Poisoned:
                    poisoned, later = True, []
                if not later and not poisoned:
                    send(sock, {"warm": requests})
            for key, _ in events:
                if key.fileobj is not sock:
                    os.read(wakeup_r, 4096)
                    continue
                request = recv(sock)
                if "preload" in request:
                    os.environ.update(request.get("env") or {})  # read by those imports
                    requests += 1
                    if not poisoned:
                        later += [m for m in request["preload"] if m not in sys.modules]
                    if not later and not poisoned:
                        send(sock, {"warm": requests})
                    continue
                if poisoned:
                    send(sock, {"refused": request["spawn"]})
                    continue
                pid = _fork_rank(sock, wakeup_r, request["spawn"])
                children.add(pid)
                send(sock, {"spawned": request["spawn"], "pid": pid})
            _reap(sock, children)
            if poisoned and not children:
                return
    except (EOFError, ConnectionError, OSError):
        pass
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> None:
    fd = int(sys.argv[1])
    now, later = (arg.split(",") if arg else [] for arg in sys.argv[2:4])
    sock = socket.socket(fileno=fd)
    try:
        for name in now:
            _preload(name, sock)
    except _Poisoned:
        return
    serve(sock, later)


class _Poisoned(Exception):
    """An import initialised CUDA in this server: it must fork no rank any more."""


def _preload(name: str, sock: socket.socket) -> None:
    import gc

    from . import cuda_init

    if "torch" in sys.modules:
        cuda_init.watch()  # from now on, the first call into the CUDA runtime is recorded
    try:
        __import__(name)
    except Exception:
        pass  # a rank that needs it will raise the real import error itself
    if cuda_init.forks_are_bad():
        send(sock, {"poisoned": name, "by": str(cuda_init.first_init() or "")})
        raise _Poisoned(name)
    gc.collect()
    gc.freeze()  # ranks' garbage collections skip (and so never copy) the preloaded objects


if __name__ == "__main__":
    main()
