"""DeepSpeed's one C++ op this course needs, built once and explicitly, never inside a rank.

On CPU, `deepspeed.init_distributed` loads its shared-memory collective op
(`deepspeed_shm_comm`) with torch's JIT extension builder, which compiles it on first use into
`$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm` (default `~/.cache/torch_extensions/py3X_cpu/...`,
`py3X_cuNNN` on a CUDA build: one folder per Python and CUDA version, not per torch release):
minutes of C++ compilation. Inside a rank with a launch timeout that is a trap. Up to torch
2.13, torch's builder marks a build by the mere existence of a `lock` file (a "baton"): a rank
killed mid-build leaves it behind and every later build or load waits on it forever. torch 2.14
holds an OS advisory lock on that file instead: the kernel releases it when the holder dies,
and the file itself stays after every build, by design (`lock_is_a_baton` tells them apart).

So: `ddp-lab build-ops` (run by the tour before lesson 12, and by `.ci/run`) builds it in a
child process with progress lines and a time limit, names the missing compiler or Python
headers, and, where the lock is a baton, removes one whose builder is dead. `require_built()`
is what a lesson-12 rank calls before `deepspeed.init_distributed`: it raises a clear error
instead of compiling. Nothing here imports deepspeed in this process.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from ..launching.processes import descendants, working_in

NAME = "deepspeed_shm_comm"
COMMAND = "ddp-lab build-ops"
STALE_AFTER_S = 30.0  # a live holder of torch's lock runs ninja in the folder within ms
BUILD = ("from deepspeed.comm.torch import build_shm_op\n"
         "import sys; sys.exit(0 if build_shm_op() is not None else 3)\n")


class OpBuildError(RuntimeError):
    """The op cannot be built or loaded here; the message says what to do."""


def build_dir() -> Path:
    """The folder torch's JIT builder uses for the op (TORCH_EXTENSIONS_DIR honoured)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch.utils.cpp_extension import get_default_build_root

        import torch
        acc = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        root = os.path.join(get_default_build_root(),
                            f"py{sys.version_info.major}{sys.version_info.minor}"
                            f"{getattr(sys, 'abiflags', '')}_{acc}")
    return Path(root) / NAME


def is_built(folder: Path | None = None) -> bool:
    return ((folder or build_dir()) / f"{NAME}.so").exists()


def _builders(folder: Path) -> list[int]:
    """Processes working in `folder` (ninja and the compilers it starts run there)."""
    return working_in(folder)


def lock_is_a_baton() -> bool:
    """Whether this torch's JIT builder blocks on the lock file's existence (`FileBaton`, torch
    <= 2.13) rather than on an OS advisory lock held on it (`FileLock`, torch 2.14: a leftover
    file is normal there). Decided by what `torch.utils.cpp_extension` uses, not by version."""
    from torch.utils import cpp_extension

    return hasattr(cpp_extension, "FileBaton") and not hasattr(cpp_extension, "FileLock")


def stale_lock(folder: Path | None = None) -> Path | None:
    """torch's `lock` in the op's folder when it is a baton (`lock_is_a_baton`), no process is
    building there and it is older than STALE_AFTER_S: the mark of a builder that was killed.
    None otherwise (always None where torch holds an advisory lock: nothing can be stale)."""
    if not lock_is_a_baton():
        return None
    lock = (folder or build_dir()) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    if age < STALE_AFTER_S or _builders(lock.parent):
        return None
    return lock


def require_toolchain() -> None:
    """Raise OpBuildError naming what a build needs and this machine lacks."""
    missing = []
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        missing.append(f"a C++ compiler (`{cxx}` is not on PATH): install gcc/g++ "
                       "(Debian/Ubuntu: apt-get install g++)")
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not header.exists():
        missing.append(f"the Python headers ({header} is missing): install python3-dev "
                       "(Debian/Ubuntu: apt-get install python3-dev)")
    if shutil.which("ninja") is None and not (Path(sys.executable).parent / "ninja").exists():
        missing.append("ninja (pip install ninja; deepspeed normally brings it)")
    if missing:
        raise OpBuildError(f"cannot build DeepSpeed's {NAME} op: missing " + "; ".join(missing))


def require_built() -> None:
    """In a rank, before deepspeed.init_distributed: refuse to compile there."""
    folder = build_dir()
    lock = stale_lock(folder)
    if lock is not None:
        raise OpBuildError(f"DeepSpeed's {NAME} op: a build was killed and left {lock}; "
                           f"every load would wait on it forever. Run `{COMMAND}` once "
                           "(it removes a dead build's lock and builds the op).")
    if not is_built(folder):
        raise OpBuildError(f"DeepSpeed's {NAME} op is not built in {folder}: "
                           "deepspeed.init_distributed would compile it now, inside this rank, "
                           f"for minutes. Run `{COMMAND}` once first (a few minutes, one time).")


def _kill_tree(proc, folder: Path) -> None:
    """Kill the build and every process under it or working in its folder, until none is left
    (bounded): ninja starts each compiler in a process group of its own, and a shell it was
    starting when killed is orphaned, so neither the build's group nor its tree is enough."""
    deadline, quiet_since = time.monotonic() + 15, None
    while time.monotonic() < deadline:
        alive = ({proc.pid} if proc.poll() is None else set())
        alive |= descendants(proc.pid) | set(_builders(folder))
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if alive:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            break
        time.sleep(0.05)
    proc.wait()


def _remove_dead_lock(folder: Path, say) -> None:
    """Remove a baton no builder holds; an advisory lock's file is left alone (removing it
    while a process holds the lock would let a second builder in)."""
    lock = folder / "lock"
    if lock_is_a_baton() and lock.exists() and not _builders(folder):
        lock.unlink(missing_ok=True)
        say(f"removed {lock}, left by a build that is no longer running")


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait(proc, start: float, timeout: float, say) -> int:
    while True:
        try:
            return proc.wait(timeout=min(30.0, max(1.0, timeout - (time.monotonic() - start))))
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise OpBuildError(f"building {NAME} did not finish in {timeout:.0f} s; "
                                   "stopped it") from None
            say(f"  still compiling ({elapsed:.0f} s)")


def ensure_built(timeout: float = 1800.0, say=print) -> bool:
    """Build the op unless it is built; True when a build ran. Bounded by `timeout` seconds;
    prints a progress line every 30 s; raises OpBuildError with the cause when it cannot."""
    folder = build_dir()
    if stale_lock(folder) is not None:
        _remove_dead_lock(folder, say)
    if is_built(folder) and not (lock_is_a_baton() and (folder / "lock").exists()):
        return False
    require_toolchain()
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{NAME}.build.log"
    say(f"Building DeepSpeed's {NAME} op into {folder} (once per machine, a few minutes; "
        f"log: {log})")
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", BUILD], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = _wait(proc, start, timeout, say)
        except BaseException:  # over time, or Ctrl-C: no compiler left running, no lock left
            _kill_tree(proc, folder)
            _remove_dead_lock(folder, say)
            raise
    if rc != 0 or not is_built(folder):
        _remove_dead_lock(folder, say)
        raise OpBuildError(f"building {NAME} failed (exit code {rc}); the log's last lines:\n"
                           + _tail(log))
    say(f"Built {NAME} in {time.monotonic() - start:.0f} s")
    return True


def main(timeout: float = 1800.0) -> int:
    """`ddp-lab build-ops`: build the op once; 0 when it is built, 1 with the cause if not."""
    try:
        if not ensure_built(timeout, say=lambda line: print(line, flush=True)):
            print(f"DeepSpeed's {NAME} op is already built in {build_dir()}")
    except OpBuildError as exc:
        print(f"ddp-lab build-ops: {exc}", file=sys.stderr)
        return 1
    return 0
