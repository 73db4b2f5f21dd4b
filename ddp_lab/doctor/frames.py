"""Stacks and tracebacks as the user should read them: the doctor's own frames (its probe, its
watchers, the launcher's fork server) folded into one line, and code that travelled to the ranks
by value (`<dynamic-code-...>`: a notebook cell, a file loaded by the CLI) named by its file
and line again, which this process still knows."""
from __future__ import annotations

import inspect
import linecache
import os
import re

from ..course.registry import lessons_folder
from ..instruments import modwalk, probes
from ..launching import frames as ours, launcher

# Where the doctor's own code lives (derived from the modules, see ddp_lab.launching.frames):
DOCTOR = ours.place(os.path.dirname(os.path.abspath(__file__)))  # its probe, watchers, checks
PROBES = ours.place(probes)  # the watchers it wraps around the user's forward
OWN = (DOCTOR, PROBES, ours.place(modwalk), ours.place(launcher)) + ours.ENGINE
LESSONS = ours.place(lessons_folder())  # the course's modules: user code, for the doctor
_FRAME = ours.FRAME_LINE
_CELL = re.compile(r".*/ipykernel_\d+/\d+\.py$|<ipython-input-[^>]*>")
FOLDED = "... (the doctor's own frames)"


def own(filename: str, function: str = "") -> bool:
    """A frame of the doctor's own code or of the launcher's (how its ranks run)."""
    return ours.in_places(filename, OWN) or ours.launchers(filename, function)


def ours_not_lessons(filename: str) -> bool:
    """A file of ddp_lab that is not a lesson's (the doctor takes the lessons' modules for
    user code: its tests run them)."""
    return ours.in_places(filename, (ours.HOME,)) and not ours.in_places(filename, (LESSONS,))


def short_file(path: str) -> str:
    """A file name that does not vary between machines or runs."""
    path = path.replace("\\", "/")
    return "<notebook cell>" if _CELL.match(path) else os.path.basename(path)


def code_map(model) -> dict[str, tuple[str, int, int]]:
    """{function name: (file, first line, last line)} of the user's own module classes."""
    out: dict[str, tuple[str, int, int]] = {}
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls.__module__.split(".")[0] in ("torch", "builtins"):
                continue
            for fn in vars(cls).values():
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                if code is None:
                    continue
                try:
                    lines, first = inspect.getsourcelines(code)
                except (OSError, TypeError):
                    continue
                out.setdefault(code.co_name, (code.co_filename, first, first + len(lines) - 1))
    return out


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
