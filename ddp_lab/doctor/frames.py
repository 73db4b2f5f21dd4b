"""Which frame is the user's, for every tool of the wing (the one place that decides it), and
stacks and tracebacks as the user should read them: the wing's own frames (its probes, its
watchers, the launcher's fork server) folded into one line, and code that travelled to the ranks
by value (`<dynamic-code-...>`: a notebook cell, a file loaded by the CLI) named by its file
and line again, which this process still knows. Places of ours are derived from the modules
(ddp_lab.launching.frames), never written as strings.

Two questions, two answers:
- in a module the doctor runs (`is_module_code`): every frame that is not torch's, Python's, an
  installed package's or ddp_lab's (a lesson's modules count as the user's: the tests run them);
- in a script watch runs (`ScriptFiles.holds`): the script's folder (the function API: its
  functions' folders), less installed packages and ddp_lab itself.
"""
from __future__ import annotations

import dis
import inspect
import linecache
import os
import re
import sys
import sysconfig

from ..course.registry import lessons_folder
from ..instruments import modwalk, probes
from ..launching import frames as ours, launcher
from .userline import DYNAMIC, describe_frame, short_file

# Where the doctor's own code lives (derived from the modules, see ddp_lab.launching.frames):
DOCTOR = ours.place(os.path.dirname(os.path.abspath(__file__)))  # its probe, watchers, checks
PROBES = ours.place(probes)  # the watchers it wraps around the user's forward
OWN = (DOCTOR, PROBES, ours.place(modwalk), ours.place(launcher)) + ours.ENGINE
LESSONS = ours.place(lessons_folder())  # the course's modules: user code, for the doctor
_FRAME = ours.FRAME_LINE
FOLDED = "... (the doctor's own frames)"


def own(filename: str, function: str = "") -> bool:
    """A frame of the doctor's own code or of the launcher's (how its ranks run)."""
    return ours.in_places(filename, OWN) or ours.launchers(filename, function)


def ours_not_lessons(filename: str) -> bool:
    """A file of ddp_lab that is not a lesson's (the doctor takes the lessons' modules for
    user code: its tests run them)."""
    return ours.in_places(filename, (ours.HOME,)) and not ours.in_places(filename, (LESSONS,))


def _named(match, where: dict) -> tuple[str, str]:
    """The frame's line with its file restored, and the source line (or "")."""
    indent, filename, line, comma, func = match.groups()
    if filename.startswith("<dynamic-code") and func in where:
        path, first, last = where[func]
        if first <= int(line) <= last:
            code = linecache.getline(path, int(line)).strip()
            return f'{indent}File "{short_file(path)}", line {line}{comma} in {func}', code
    return match.group(0), ""


def tidy(trace: str, where: dict | None = None) -> str:
    """`trace` with the doctor's own frames folded and `<dynamic-code>` frames named."""
    out, folding = [], False
    lines = trace.splitlines()
    i = 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if not m:  # a header, a message, another rank's stack: never the folded frames' own
            out.append(lines[i])
            folding = False
            i += 1
            continue
        body = [lines[i]]
        i += 1
        while i < len(lines) and not _FRAME.match(lines[i]) and lines[i].startswith(m.group(1) + "  "):
            body.append(lines[i])
            i += 1
        if own(m.group(2), m.group(5)):
            if not folding:
                out.append(m.group(1) + FOLDED)
            folding = True
            continue
        folding = False
        head, code = _named(m, where or {})
        out.append(head + m.string[m.end():])
        if code and len(body) == 1:
            out.append(f"{m.group(1)}    {code}")
        out += body[1:]
    return "\n".join(out)


# --- in a module the doctor runs -----------------------------------------------------------------

_NOT_THE_USERS = ("/torch/", "/contextlib.py", "/warnings.py", "/functools.py", "<frozen")
_STDLIB = sysconfig.get_paths()["stdlib"].replace("\\", "/")
# as instruments.compilewatch matches a frame's path: "/" + each place of ours
SLASHED_OWN = tuple("/" + place for place in OWN)


def skipped(name: str, skip: tuple[str, ...] = ()) -> bool:
    """A frame that is neither the user's nor the doctor's decision: torch's, Python's, the
    doctor's watchers' (and `skip`: parts of file names)."""
    return any(s in name for s in _NOT_THE_USERS + skip) or ours.in_places(name, (DOCTOR, PROBES))


def user_frame(frame=None, skip: tuple[str, ...] = ()) -> str:
    """The innermost frame of the stack (from `frame`, else the caller's) outside torch and
    `skip`, described (userline.describe_frame); "" when that frame is the doctor's own (e.g. its
    loss) or the launcher's, not the user's code."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not skipped(name, skip):
            if ours_not_lessons(name) or name == "<string>":
                return ""
            code = frame.f_code
            return describe_frame(name, frame.f_lineno, getattr(code, "co_qualname", code.co_name))
        frame = frame.f_back
    return ""


def user_frame_in(stack: str, where: dict | None = None) -> str:
    """The innermost frame of the main thread that is the user's code, as `fn() in file.py`;
    code shipped by value (`<dynamic-code>`) is named by its file when `where` (a code map)
    knows it."""
    for filename, func in ours.main_thread_frames(stack):
        name = filename.replace("\\", "/")
        if skipped(name) or ours.launchers(name, func) or name.startswith(_STDLIB):
            continue
        if name.startswith(DYNAMIC):
            known = (where or {}).get(func)
            return f"{func}()" + (f" in {short_file(known[0])}" if known else "")
        return f"{func}() in {short_file(name)}"
    return ""


def is_module_code(code) -> bool:
    """Is this code the user's (not torch's, Python's, a package's, the doctor's)?"""
    name = code.co_filename.replace("\\", "/")
    return not (skipped(name) or own(name, code.co_name) or ours_not_lessons(name)
                or "/site-packages/" in name or "/lib/python3" in name)


def user_site(frame) -> tuple | None:
    """(file, line, function) of the innermost frame that is the user's code."""
    while frame is not None:
        if is_module_code(frame.f_code):
            return (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def raised_at(exc) -> tuple | None:
    """The user's innermost frame in `exc`'s traceback (the line that raised, in their code)."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        found = (code.co_filename, tb.tb_lineno, code.co_name) if is_module_code(code) else found
        tb = tb.tb_next
    return found


# --- in a script watch runs ----------------------------------------------------------------------

_PACKAGE_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # ddp_lab/


def in_package(filename) -> bool:
    """A file of ddp_lab itself (watch's checks, its core)."""
    return os.path.abspath(filename or "").startswith(_PACKAGE_HOME + os.sep)


class ScriptFiles:
    """The user's files in a script run: the script's folder and `folders` (the function API:
    its functions' folders), less installed packages and ddp_lab; code shipped by value
    (`<dynamic-code>`) is the user's when the run is the function API's (`dynamic`)."""

    def __init__(self, script: str, folders=(), dynamic: bool = False):
        self.script = os.path.abspath(script)
        self.folder = os.path.dirname(self.script)
        self.folders = tuple(dict.fromkeys([self.folder, *map(os.path.abspath, folders)]))
        self.dynamic = dynamic
        self._held: dict[str, bool] = {}  # an absolute filename's answer: the checks ask per frame

    def holds(self, filename: str) -> bool:  # "<frozen runpy>", "<string>": no file (abspath would
        found = self._held.get(filename)     # place it in the working directory, the script's own)
        if found is None:
            name = os.path.abspath(filename)
            found = self.dynamic if filename.startswith(DYNAMIC) else not filename.startswith("<") and (
                name == self.script or any(name.startswith(f + os.sep) for f in self.folders)) and not any(
                s in name for s in (os.sep + "site-packages" + os.sep, _PACKAGE_HOME + os.sep))
            if os.path.isabs(filename):  # a relative one depends on the working directory
                self._held[filename] = found
        return found

    def frame(self, frame):
        """(file, line number, the line's text) of the innermost frame in the user's files."""
        found = self._innermost(frame)
        return None if found is None else self._site(found, found.f_lineno)

    def _innermost(self, frame):
        while frame is not None and not self.holds(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def _site(self, frame, lineno: int):
        name = frame.f_code.co_filename
        if name.startswith(DYNAMIC):  # named in the parent: userline.restore_where
            code = frame.f_code
            return f"<dynamic-code:{getattr(code, 'co_qualname', code.co_name)}>", lineno, ""
        return name, lineno, linecache.getline(name, lineno).strip()

    def loop_start(self, frame):
        """(file, line number, text) where the user's loop over an iterator began: the innermost
        frame in the user's files, or, when that frame is a generator's (a function that wraps
        the loop in `yield`: an endless loader, a prefetcher), the statement that built that
        generator in the user's frame that runs it, found by the name holding it (the
        generator's arguments, an epoch to start from, are given there); the generator's own
        line when no name holds it."""
        found = self._innermost(frame)
        if found is None:
            return None
        caller = found.f_back
        if found.f_code.co_flags & inspect.CO_GENERATOR and caller is not None \
                and self.holds(caller.f_code.co_filename):
            for name, value in list(caller.f_locals.items()):
                if getattr(value, "gi_frame", None) is found:
                    lineno = _stored_at(caller.f_code, name, caller.f_lineno)
                    if lineno:
                        return self._site(caller, lineno)
        return self._site(found, found.f_lineno)


def _stored_at(code, name: str, before: int) -> int | None:
    """The line of `code` that last stores `name` at or before line `before` (else its first)."""
    lines = [i.positions.lineno for i in dis.get_instructions(code)
             if i.opname.startswith("STORE_") and i.argval == name and i.positions.lineno]
    earlier = [n for n in lines if n <= before]
    return (earlier or lines or [None])[-1 if earlier else 0]


def script_frames(text: str, folder: str, innermost_first: bool) -> list:
    """[(path, line)] of the user's frames in a stack dump or traceback, innermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text or "")
    block = next((b for b in blocks if "<module>" in b), blocks[0])
    found = [(p, int(n)) for p, n, _ in ours.FRAME.findall(block) if _in_script(p, folder)]
    return found if innermost_first else found[::-1]


def _in_script(path: str, folder: str) -> bool:
    path = os.path.abspath(path)
    package = os.sep + os.path.basename(_PACKAGE_HOME) + os.sep
    return (path.startswith(folder + os.sep) and os.sep + "site-packages" + os.sep not in path
            and package not in path[len(folder):])


def last_frames(exc: BaseException, n: int = 3) -> str:
    """The innermost `n` frames of the exception: the user's, and the one that raised (the
    doctor's own and torch's inner frames left out), file names short."""
    import traceback

    tb = traceback.extract_tb(exc.__traceback__)
    found = [f for f in tb if not ours.in_places(f.filename, (DOCTOR,))
             and ("/torch/" not in f.filename.replace("\\", "/") or f is tb[-1])][-n:]
    return "\n".join(f'  File "{short_file(f.filename)}", line {f.lineno}, in {f.name}'
                     + (f"\n    {f.line.strip()}" if f.line else "") for f in found)


# --- frames of the framework: what they do is not the user's decision -------------------------

FRAMEWORK = ("/torch/distributed/", "/torch/nn/parallel/", "/torch/optim/")  # their writes are theirs
OPTIMIZERS = ("/torch/optim/", "/deepspeed/", "/torch/distributed/")  # their reads are theirs


def first_of(frame, holds) -> str:
    """Walking out from `frame`: "user" when a frame of the user's files (`holds(filename)`)
    comes first, "theirs" when one of torch's that writes parameters (DDP's and FSDP's copies,
    the optimizer's update) does, "" when neither does."""
    while frame is not None:
        name = frame.f_code.co_filename
        if holds(name):
            return "user"
        if any(s in name.replace("\\", "/") for s in FRAMEWORK):
            return "theirs"
        frame = frame.f_back
    return ""


def in_optimizer(frame) -> bool:
    """Whether an optimizer (or DeepSpeed, or torch.distributed) is on the stack from `frame`."""
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if any(s in name for s in OPTIMIZERS):
            return True
        frame = frame.f_back
    return False


def in_dynamo(traceback: str) -> bool:
    """Whether torch.compile's dynamo is among a traceback's frames (it raised while tracing)."""
    return "/torch/_dynamo/" in traceback.replace("\\", "/")
