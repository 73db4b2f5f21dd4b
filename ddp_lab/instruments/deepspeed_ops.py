"""DeepSpeed's one C++ op this course needs, built once per environment and explicitly, never
inside a rank.

On CPU, `deepspeed.init_distributed` loads its shared-memory collective op
(`deepspeed_shm_comm`) with torch's JIT extension builder, which compiles it on first use into
`$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm` (torch's default, `~/.cache/torch_extensions/py3X_cpu/`,
is one folder per Python and CUDA version, shared by every environment of that kind). Its
`build.ninja` names the environment's paths (torch's headers, DeepSpeed's sources, Python's), so a
second environment with the same torch rewrites it and ninja rebuilds the op: inside a rank, for
minutes, under a launch timeout that kills the build and (up to torch 2.13) leaves its `lock`
behind, which blocks every later build or load (issue 47). So the course keeps the op per
environment: `build_root()` is `<root>/py3X_cpu-<key>`, where <root> is `$TORCH_EXTENSIONS_DIR` if
set, else `torch_extensions/` in the environment (`sys.prefix`), and <key> is a hash of what the
build depends on (the environment's path, torch's and DeepSpeed's versions and places, Python's
headers, the compiler, the ninja on PATH, whose log another version would start over): another
environment, or a new torch or DeepSpeed, gets a folder of its own instead of rebuilding this one.

Up to torch 2.13, torch's builder marks a build by the mere existence of a `lock` file (a
"baton"): a rank killed mid-build leaves it behind and every later build or load waits on it
forever. torch 2.14 holds an OS advisory lock on that file instead: the kernel releases it when
the holder dies, and the file itself stays after every build, by design (`lock_is_a_baton` tells
them apart).

So: `ddp-lab build-ops` (run by the tour before lesson 12, and by `.ci/run`) builds it in a
child process with progress lines and a time limit, names the missing compiler or Python
headers, and, where the lock is a baton, removes one whose builder is dead. `require_built()`
is what a rank calls before `deepspeed.init_distributed`: it points the rank's torch at this
environment's folder and raises a clear error, naming `ddp-lab build-ops`, instead of compiling
(the op missing, a dead build's lock, or a build that ninja would redo); the course's registry
makes that error one of the run (`Variant.run` raises it), not a scenario's outcome. Nothing here
imports deepspeed in this process.
"""
from __future__ import annotations

import hashlib
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


def _depends_on() -> dict[str, str]:
    """What the op's build.ninja and objects depend on in this environment (DeepSpeed read from
    its metadata, not imported)."""
    from importlib import metadata

    import torch
    try:
        dist = metadata.distribution("deepspeed")
        deepspeed = f"{dist.version} {dist.locate_file('deepspeed')}"
    except metadata.PackageNotFoundError:
        deepspeed = "(not installed)"
    return {"environment": sys.prefix, "python": sys.version.split()[0] + getattr(sys, "abiflags", ""),
            "torch": f"{torch.__version__} {os.path.dirname(torch.__file__)}", "deepspeed": deepspeed,
            "headers": sysconfig.get_paths()["include"], "compiler": os.environ.get("CXX", "c++"),
            "ninja": _ninja() or "(none)"}


def build_root() -> Path:
    """This environment's folder for the course's ops: what TORCH_EXTENSIONS_DIR must be when
    torch's JIT builder builds or loads them (`ddp-lab build-ops`, `require_built`)."""
    import torch

    acc = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    key = hashlib.sha256(repr(sorted(_depends_on().items())).encode()).hexdigest()[:10]
    tag = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_{acc}-{key}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is not None and os.path.basename(root.rstrip(os.sep)) == tag:
        return Path(root)  # already this environment's folder (require_built set it)
    if root is None:
        root = os.path.join(sys.prefix, "torch_extensions")
        if not os.access(sys.prefix, os.W_OK):  # a system Python: the user's cache instead
            from torch.utils.cpp_extension import get_default_build_root
            root = os.path.join(get_default_build_root(), "ddp-lab")
    return Path(root) / tag


def build_dir() -> Path:
    """The op's folder in this environment (`build_root()`, TORCH_EXTENSIONS_DIR honoured)."""
    return build_root() / NAME


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


def _ninja() -> str | None:
    """The ninja torch's builder runs: the first on PATH (`cpp_extension` runs plain `ninja`).
    Another version would read its log as too old or too new and start it over, deleting it: the
    next load would then rebuild everything."""
    here = Path(sys.executable).parent / "ninja"
    return shutil.which("ninja") or (str(here) if here.exists() else None)


def out_of_date(folder: Path | None = None) -> str:
    """What ninja would redo in the op's built folder ("" when nothing, or when it cannot tell):
    a source or header newer than the op, e.g. DeepSpeed or torch reinstalled in place. Asked of
    a copy of the folder (mtimes kept, about 1 MB): a dry run still starts over a log it finds of
    another ninja version, which would make the next load rebuild everything."""
    import tempfile

    folder = folder or build_dir()
    ninja = _ninja()
    if ninja is None or not (folder / "build.ninja").is_file():
        return ""
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-lab-ninja-") as tmp:
            copy = shutil.copytree(folder, Path(tmp) / folder.name, ignore=shutil.ignore_patterns("lock"))
            out = subprocess.run([ninja, "-n", "-C", str(copy)], capture_output=True, text=True,
                                 timeout=30)
    except (OSError, shutil.Error, subprocess.SubprocessError):
        return ""
    if out.returncode != 0:  # e.g. a source that is gone: a build would fail there too
        said = (out.stderr or out.stdout).strip().splitlines()
        return said[-1] if said else f"ninja -n exited {out.returncode}"
    steps = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
    return f"{len(steps)} build step(s) to redo" if steps else ""


def require_built() -> None:
    """In a rank, before deepspeed.init_distributed: point this rank's torch at this
    environment's folder (TORCH_EXTENSIONS_DIR: the rank is a process of its own, whose
    environment the launcher sets afresh), and refuse to compile there."""
    folder = build_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(folder.parent)
    lock = stale_lock(folder)
    if lock is not None:
        raise OpBuildError(f"DeepSpeed's {NAME} op: a build was killed and left {lock}; "
                           f"every load would wait on it forever. Run `{COMMAND}` once "
                           "(it removes a dead build's lock and builds the op).")
    if not is_built(folder):
        raise OpBuildError(f"DeepSpeed's {NAME} op is not built for this environment "
                           f"({sys.prefix}) in {folder}: deepspeed.init_distributed would compile "
                           f"it now, inside this rank, for minutes. Run `{COMMAND}` once first, "
                           "with this environment's Python (a few minutes, one time).")
    stale = out_of_date(folder)
    if stale:
        raise OpBuildError(f"DeepSpeed's {NAME} op in {folder} is out of date ({stale}): "
                           "deepspeed.init_distributed would rebuild it now, inside this rank. "
                           f"Run `{COMMAND}` once first, with this environment's Python.")


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
    if (is_built(folder) and not (lock_is_a_baton() and (folder / "lock").exists())
            and not out_of_date(folder)):
        return False
    require_toolchain()
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.parent / f"{NAME}.build.log"
    say(f"Building DeepSpeed's {NAME} op into {folder} (once per environment, a few minutes; "
        f"log: {log})")
    start = time.monotonic()
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(folder.parent))  # where a rank looks
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", BUILD], stdout=out, env=env,
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
