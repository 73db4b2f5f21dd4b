"""`ddp-lab check`: the attendees' pre-flight check before a workshop.

One line per check; exit status 0 only when every check passes. It checks what the day needs:
Python, the torch release and build, that two real ranks launch (and how long that took), that
DeepSpeed's C++ op is built and loads with this torch and Python (lesson 12's ranks refuse to
compile it; when it is not built, whether gcc/g++ and the Python headers are here to build it),
and that JupyterLab and ipywidgets are installed, and importable by the notebook kernel. On a
shared machine it warns (without failing) when other users are on it: the ranks' rendezvous
store has no password (the instructor guide, "On a shared node", says what that means).
"""
from __future__ import annotations

from importlib import metadata
import os
import pwd
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

MIN_PYTHON = (3, 10)
# The oldest torch every lesson runs on: lesson 17's scenario 4 gives torchrun `--shutdown-timeout`,
# an option since torch 2.12. pyproject.toml's `torch>=` and tools/upgrade_check.py's floor say the same
# (tests/test_upgrade_check.py).
MIN_TORCH = (2, 12)
TESTED_TORCH = "2.13.0"  # requirements.txt's pin
KERNEL_IMPORTS = ("torch", "ddp_lab", "ipywidgets", "ipykernel")


@dataclass
class Item:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warn: bool = False  # passes, but says something to mind (with `fix` as the advice)

    def line(self) -> str:
        mark = "FAIL" if not self.ok else "warn" if self.warn else "ok  "
        text = f"{mark}  {self.name:<12} {self.detail}"
        return text + (f"\n      {'fix' if not self.ok else 'note'}: {self.fix}"
                       if (not self.ok or self.warn) and self.fix else "")


def _release(version: str) -> tuple[int, ...]:
    """"2.13.0+cpu" -> (2, 13, 0)."""
    parts = []
    for p in version.split("+")[0].split("."):
        digits = "".join(c for c in p if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def python_version() -> Item:
    v = sys.version_info
    ok = (v.major, v.minor) >= MIN_PYTHON
    return Item("python", ok, f"{v.major}.{v.minor}.{v.micro} ({sys.executable})",
                 f"use Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer")


def torch_build() -> Item:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return Item("torch", False, f"cannot import torch ({exc})",
                     "pip install -r requirements.txt (it pins the CPU build)")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    from ..launching.cuda_init import gpu_count

    gpus = gpu_count()
    detail = f"{torch.__version__}, {build}, {gpus} GPU(s)"
    detail += "" if torch.__version__.startswith(TESTED_TORCH) else f" (the course is tested on {TESTED_TORCH})"
    if _release(torch.__version__) < MIN_TORCH:
        return Item("torch", False, detail, f"torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer is needed")
    if not (dist.is_available() and dist.is_gloo_available()):
        return Item("torch", False, detail + ", no gloo backend", "install a torch build with torch.distributed")
    return Item("torch", True, detail + ", gloo available")


def _two_rank_body():
    import torch
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item()


def two_ranks(timeout: float = 60) -> Item:
    from ..launching.launcher import launch

    start = time.time()
    try:
        result = launch(_two_rank_body, world_size=2, backend="gloo", timeout=timeout, label="check")
    except Exception as exc:  # the launcher itself failed: name it, keep the cause
        return Item("two ranks", False, f"the launch failed: {type(exc).__name__}: {exc}")
    seconds = time.time() - start
    if result.ok and result.values == [3.0, 3.0]:
        return Item("two ranks", True, f"launched, all_reduce gave 3.0 on both, in {seconds:.1f} s")
    return Item("two ranks", False, f"{result.status}: {result.describe_failure().splitlines()[0]}",
                 "a firewall or VPN can block localhost ports; try again off the VPN, or ask the instructor")


def deepspeed_op() -> Item:
    """DeepSpeed's one C++ op (lesson 12 and the doctor's zero3): built for this environment,
    up to date and loadable; when not, what building it needs and the one command that builds it."""
    from ..instruments import deepspeed_ops as ops

    try:
        metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return Item("deepspeed", False, "not installed (lesson 12 needs it)",
                     "pip install -r requirements.txt (it pins deepspeed)")
    folder = ops.build_dir()
    if ops.stale_lock(folder) is not None:
        return Item("deepspeed", False, f"a killed build left {folder / 'lock'}: lesson 12 would wait "
                     "on it forever", f"{ops.COMMAND} (it removes a dead build's lock and builds the op)")
    if not ops.is_built(folder):
        detail = f"its {ops.NAME} op is not built in {folder}: lesson 12 fails with OpBuildError"
        try:
            ops.require_toolchain()
        except ops.OpBuildError as exc:
            missing = str(exc).split("missing ", 1)[-1]
            return Item("deepspeed", False, detail + ", and this machine cannot build it yet",
                         f"{missing}; then {ops.COMMAND} (once, a few minutes)")
        return Item("deepspeed", False, detail + " (gcc/g++ and the Python headers are here to build it)",
                     f"{ops.COMMAND} (once, a few minutes)")
    stale = ops.out_of_date(folder)
    if stale:  # the first rank to load it would rebuild it, inside the rank
        return Item("deepspeed", False, f"its {ops.NAME} op in {folder} is out of date ({stale}): "
                     "lesson 12 would fail with OpBuildError", f"{ops.COMMAND} (it rebuilds the op)")
    try:  # built by another torch or Python, it does not load: say so now, not in a rank
        import importlib.util

        import torch  # noqa: F401  (the op links against torch's libraries)
        so = folder / f"{ops.NAME}.so"
        spec = importlib.util.spec_from_file_location(ops.NAME, so)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as exc:
        return Item("deepspeed", False, f"its {ops.NAME} op in {folder} does not load with this "
                     f"torch/Python ({type(exc).__name__}: {exc})", f"rm -r {folder} && {ops.COMMAND}")
    return Item("deepspeed", True, f"{metadata.version('deepspeed')}, its {ops.NAME} op built and "
                 f"loads ({folder})")


def installed(dist_name: str) -> Item:
    """Installed in this environment (its metadata: importing JupyterLab takes seconds)."""
    try:
        return Item(dist_name, True, metadata.version(dist_name))
    except metadata.PackageNotFoundError:
        return Item(dist_name, False, "not installed", f"pip install {dist_name} (or -r requirements.txt)")


def kernel_python() -> tuple[str, str]:
    """(kernel name, interpreter) of the notebook kernel JupyterLab starts for the notebooks."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    argv0 = spec.argv[0]
    return spec.display_name, sys.executable if argv0 in ("python", "python3", "{python}") else argv0


def notebook_kernel() -> Item:
    try:
        name, python = kernel_python()
    except Exception as exc:
        return Item("kernel", False, f"no python3 Jupyter kernel ({type(exc).__name__}: {exc})",
                     "python -m ipykernel install --user")
    # find_spec, not import: as sure that the kernel's interpreter has them, and seconds faster
    code = ("import importlib.util as u, sys; missing = [m for m in sys.argv[1:] if u.find_spec(m) is None]; "
            "print(' '.join(missing)); sys.exit(1 if missing else 0)")
    proc = subprocess.run([python, "-c", code, *KERNEL_IMPORTS], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        missing = proc.stdout.strip() or (proc.stderr.strip().splitlines() or ["?"])[-1]
        return Item("kernel", False, f"{name!r} ({python}) lacks: {missing}",
                     f"{python} -m pip install -r requirements.txt")
    return Item("kernel", True, f"{name!r} ({python}) has {', '.join(KERNEL_IMPORTS)}")


# glibc's utmp record (Linux, 64 and 32 bit alike): type, pid, line, id, user, host, exit
# status, session, time, address, reserved: 384 bytes. USER_PROCESS marks a login session.
UTMP = struct.Struct("hi32s4s32s256shhiii4i20s")
USER_PROCESS = 7
UTMP_PATHS = ("/run/utmp", "/var/run/utmp")


def utmp_users(paths=UTMP_PATHS) -> set[str]:
    """Who has a login session, as `who` reads it from utmp; empty where there is no utmp (a
    container often has none)."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        records = (UTMP.unpack_from(data, at) for at in range(0, len(data) - UTMP.size + 1, UTMP.size))
        return {r[4].split(b"\0")[0].decode(errors="replace") for r in records
                if r[0] == USER_PROCESS and r[4].strip(b"\0")}
    return set()


def process_owners(proc: str = "/proc") -> set[int]:
    """The uids that own a process here, from /proc (it also sees users of a container or a
    batch job, who have no utmp entry; mounted with hidepid it shows this user's only)."""
    owners = set()
    for entry in os.listdir(proc) if os.path.isdir(proc) else ():
        if entry.isdigit():
            try:
                owners.add(os.stat(os.path.join(proc, entry)).st_uid)
            except OSError:  # the process ended meanwhile
                pass
    return owners


def _uid_min(path: str = "/etc/login.defs") -> int:
    """The lowest uid of a person's account (system services run below it); 1000 by default."""
    try:
        for line in open(path, encoding="utf-8", errors="replace"):
            if line.split()[:1] == ["UID_MIN"]:
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 1000


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def other_users(logged_in=utmp_users, owners=process_owners) -> Item:
    """Warn when other people use this machine: logged in (utmp), or running processes under
    an account of their own (uid >= UID_MIN, not nobody)."""
    me = os.getuid()
    people = {u for u in owners() if u >= _uid_min() and u != me and u != 65534}
    names = sorted((logged_in() - {_name(me)}) | {_name(u) for u in people})
    if not names:
        return Item("users", True, "no other user on this machine (logins in utmp, process owners in /proc)")
    return Item("users", True, f"{len(names)} other user(s) on this machine: {', '.join(names[:8])}"
                + (", ..." if len(names) > 8 else ""),
                "the ranks' store listens on 127.0.0.1 without a password, and any user here can "
                "reach it: fine for a workshop, not for private data (the instructor guide, "
                "INSTRUCTOR.md: On a shared node)",
                warn=True)


ITEMS: tuple[Callable[[], Item], ...] = (
    python_version, torch_build, two_ranks, deepspeed_op,
    lambda: installed("jupyterlab"), lambda: installed("ipywidgets"), notebook_kernel, other_users,
)


def preflight(items=ITEMS, out=print) -> int:
    """Run every item of the checklist, print one line each; 0 when all pass, 1 otherwise."""
    failed = 0
    for item in items:
        result = item()
        out(result.line())
        failed += not result.ok
    out("all checks passed: you are ready" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0
