"""CUDA without fork poisoning: a GPU count that never initialises CUDA, a watch that names the
code that did, and a probe that says whether a child forked now could still use CUDA.

On a CUDA build of torch (what a plain `pip install torch` gives on Linux, GPU or not),
`torch.cuda.is_available()`, `torch.cuda.device_count()` where NVML cannot answer, and every
first use of CUDA call into the CUDA runtime, and torch then marks every child forked afterwards
as a "bad fork": CUDA there raises "Cannot re-initialize CUDA in forked subprocess". On the CPU
build none of this exists. ddp_lab's ranks are forked from a fork server, so nothing the server
imports may do it; and where a user forks (a forking launcher, DataLoader workers using CUDA),
"which import initialised CUDA?" is the question to answer.

The lowest layer of the package: it imports nothing of ddp_lab but `sanitize` beside it.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass

from .sanitize import sanitize

# The two Python-visible doors to the CUDA runtime: torch.cuda's lazy initialisation (also what
# C++ calls on a first CUDA tensor: it looks `torch.cuda._lazy_init` up by name) and the device
# count behind `is_available()` / `device_count()`. Both register torch's fork handler.
DOORS = (("torch.cuda", "_lazy_init"), ("torch._C", "_cuda_getDeviceCount"))


def gpu_count() -> int:
    """How many GPUs this process would see, found without initialising CUDA: 0 on a build of
    torch without CUDA; NVML's count (as `torch.cuda.device_count()` counts before CUDA is
    initialised, CUDA_VISIBLE_DEVICES honoured); 0 where NVML is missing and no GPU driver is
    there either (a CUDA build on a machine without a GPU); otherwise asked of a fresh Python
    process, once, so that this one stays unpoisoned."""
    import torch

    cuda = torch.cuda
    if not cuda._is_compiled():
        return 0
    if cuda.is_initialized():
        return cuda.device_count()
    count = _count_without_cuda(cuda, torch.version.hip)
    if count >= 0:
        return count
    return _count_in_subprocess() if _driver_present(torch.version.hip) else 0


def _count_without_cuda(cuda, hip) -> int:
    """NVML's (or AMD SMI's) count, negative when it cannot answer; torch's own helpers."""
    counter = getattr(cuda, "_device_count_amdsmi" if hip else "_device_count_nvml", None)
    if counter is None:
        return -1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Can't initialize NVML": we fall back below
        try:
            return int(counter())
        except Exception:  # noqa: BLE001 - a private helper of torch: any failure is "unknown"
            return -1


def _driver_present(hip) -> bool:
    """A GPU driver's device nodes (Linux, WSL); elsewhere assume one may be there."""
    if not sys.platform.startswith("linux"):
        return True
    nodes = ("/dev/kfd",) if hip else ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")
    return any(os.path.exists(n) for n in nodes)


@functools.lru_cache(maxsize=1)
def _count_in_subprocess() -> int:
    code = "import torch; print(torch.cuda.device_count())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
        return int(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class CudaInit:
    """The first call that reached the CUDA runtime while `watch()` was on."""

    api: str            # what the code called, e.g. "torch.cuda.is_available()"
    file: str           # the calling file (machine paths removed) ...
    line: int           # ... and line
    function: str       # the calling function ("<module>" for import-time code)
    importing: str      # the module being imported at the time ("" when none was)

    def __str__(self) -> str:
        where = f"{self.api} at {self.file}:{self.line}"
        return where + (f" (while importing {self.importing})" if self.importing else "")


_first: list[CudaInit] = []
_originals: dict[tuple[str, str], object] = {}


def watch(doors=None) -> bool:
    """Wrap the doors to the CUDA runtime so that the first call through them is recorded
    (`first_init()`); then call the real function. `doors`: (module object or name, attribute)
    pairs, default `DOORS` (tests give their own). False when there is nothing to watch (a CPU
    build of torch has no such doors)."""
    watched = False
    for owner, name in doors or DOORS:
        owner = sys.modules.get(owner) if isinstance(owner, str) else owner
        real = getattr(owner, name, None)
        if real is None or getattr(real, "_ddp_lab_watched", False):
            watched |= real is not None
            continue
        _originals[(id(owner), name)] = (owner, name, real)
        label = f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
        setattr(owner, name, _recording(real, label))
        watched = True
    return watched


def unwatch() -> None:
    """Put the real functions back (a rank forked from a watched fork server calls this)."""
    for owner, name, real in _originals.values():
        setattr(owner, name, real)
    _originals.clear()


def _recording(real, label: str):
    def door(*args, **kwargs):
        if not _first:
            _first.append(_caller(sys._getframe(1), label))
        return real(*args, **kwargs)

    door._ddp_lab_watched = True
    door.__name__ = getattr(real, "__name__", label.rsplit(".", 1)[-1])
    door.__wrapped__ = real
    return door


def _is_torch(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return "/torch/" in path or path == __file__.replace("\\", "/")


def _caller(frame, door: str) -> CudaInit:
    """The innermost frame outside torch (the code that asked), the outermost torch frame
    below it (the API it called) and the innermost module being imported."""
    api, importing = door, ""
    while frame is not None and _is_torch(frame.f_code.co_filename):
        module = frame.f_globals.get("__name__", "")
        api = f"{module}.{frame.f_code.co_name}" if frame.f_code.co_name != "<module>" else module
        frame = frame.f_back
    if frame is None:
        return CudaInit(f"{api}()", "<unknown>", 0, "", "")
    site = frame
    while frame is not None:
        if frame.f_code.co_name == "<module>" and not _is_torch(frame.f_code.co_filename):
            importing = frame.f_globals.get("__name__", "")
            if importing != "__main__":
                break
            importing = ""
        frame = frame.f_back
    return CudaInit(f"{api}()", sanitize(site.f_code.co_filename), site.f_lineno,
                    site.f_code.co_name, importing)


def first_init() -> CudaInit | None:
    """The first call through a watched door, if any."""
    return _first[0] if _first else None


def forks_are_bad() -> bool:
    """Whether a child forked now would be in torch's "bad fork" state (CUDA unusable there).
    Only a child can tell, so one is forked and asked; always False on a build without CUDA."""
    import torch

    if not torch.cuda._is_compiled() or not hasattr(os, "fork"):
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3


def describe() -> str:
    """One line for a report: whether CUDA was initialised in this process, and by what."""
    import torch

    if not torch.cuda._is_compiled():
        return "this torch has no CUDA: nothing here can initialise it"
    if (first := first_init()) is not None:
        return (f"CUDA was first initialised in this process by {first}; a child forked "
                "afterwards cannot use CUDA")
    if not forks_are_bad():
        return "CUDA has not been initialised in this process"
    return ("CUDA was initialised in this process before ddp_lab watched it; call "
            f"{__name__}.watch() right after importing torch to learn by what")
