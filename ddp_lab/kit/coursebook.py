"""The course as a set of executed notebooks: which ones exist, their titles, tags, core path,
measured execution time. The workshop kit and the site read the notebooks through this module.

Lessons are found by globbing `NN_name.ipynb`, never from a fixed list, so a new lesson joins the
kit and the site the moment its notebook is committed.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat

WORDS_PER_MINUTE = 150  # technical prose read beside code and outputs (a measured-speed guess)
_NAME = re.compile(r"^(\d\d)_\w+\.ipynb$")
_TITLE_PREFIX = re.compile(r"^(?:Lesson\s+)?\d\d\s*·\s*")


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


@dataclass
class LessonNotebook:
    path: Path
    nb: nbformat.NotebookNode

    @property
    def id(self) -> str:
        return self.path.name[:2]

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def title(self) -> str:
        for cell in self.nb.cells:
            if cell.cell_type == "markdown":
                for line in cell.source.splitlines():
                    if line.startswith("# "):
                        return _TITLE_PREFIX.sub("", line[2:].strip())
        return self.stem

    def core_cells(self) -> list:
        """Every cell not tagged `deeper` (second reading) nor `solution`."""
        return [c for c in self.nb.cells if not {"deeper", "solution"} & set(tags(c))]

    def core_words(self) -> int:
        """Words (matched by \\w+) of the markdown a student reads in class: the core path less
        the solutions. COURSE.md's 1,500-word bound counts the solutions too
        (tests/course/test_notebook_experience.py holds every notebook to it)."""
        return sum(len(re.findall(r"\w+", c.source)) for c in self.core_cells() if c.cell_type == "markdown")

    def reading_minutes(self) -> float:
        return self.core_words() / WORDS_PER_MINUTE

    def execution_seconds(self) -> float | None:
        """Seconds the committed execution took, summed over its code cells from the timing that
        nbclient records in each cell (`metadata.execution`); None when it was not recorded."""
        total, seen = 0.0, False
        for cell in self.nb.cells:
            timing = cell.get("metadata", {}).get("execution", {})
            start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
            if start and end:
                total += (_when(end) - _when(start)).total_seconds()
                seen = True
        return total if seen else None

    def executed_at(self) -> str:
        """When the committed execution started (UTC, to the minute), or "" if not recorded."""
        for cell in self.nb.cells:
            start = cell.get("metadata", {}).get("execution", {}).get("iopub.execute_input")
            if start:
                return _when(start).strftime("%Y-%m-%d %H:%M")
        return ""

    def sections(self) -> list[tuple[str, list]]:
        """(`## heading`, the cells under it) in order; the cells before the first `##` are ""."""
        out: list[tuple[str, list]] = [("", [])]
        for cell in self.nb.cells:
            first = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
            if cell.cell_type == "markdown" and first.startswith("## "):
                out.append((first[3:].strip(), []))
            out[-1][1].append(cell)
        return [s for s in out if s[1]]


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def lesson_notebooks(folder="notebooks") -> list[LessonNotebook]:
    """Every `NN_name.ipynb` in `folder`, in lesson order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"no notebook folder {str(folder)!r}")
    paths = sorted(p for p in folder.glob("*.ipynb") if _NAME.match(p.name))
    if not paths:
        raise ValueError(f"no lesson notebooks (NN_name.ipynb) in {str(folder)!r}")
    return [LessonNotebook(p, nbformat.read(p, as_version=4)) for p in paths]


def student_copy(nb):
    """The notebook without its `solution` cells (and any heading they leave with nothing under
    it, e.g. a "## Solutions" at the end of the recap's cell), with the outputs of `exercise`
    cells cleared; every other cell keeps its executed outputs."""
    nb = copy.deepcopy(nb)
    cells = [c for c in nb.cells if "solution" not in tags(c)]
    for cell in cells:
        if cell.cell_type == "code" and "exercise" in tags(cell):
            cell.outputs, cell.execution_count = [], None
    nb.cells = drop_empty_headings(cells)
    return nb


_HEADING = re.compile(r"^(#{1,6})\s")


def _lines(cell) -> list[str]:
    """A markdown cell's lines, with those inside ``` fences marked as text (never a heading)."""
    out, fenced = [], False
    for line in cell.source.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        out.append(("\0" if fenced else "") + line)
    return out


def _level(line: str) -> int | None:
    m = _HEADING.match(line)
    return len(m.group(1)) if m else None


def empty_headings(cells) -> list[tuple[int, int]]:
    """(cell index, line index) of every markdown heading with nothing under it: what follows it,
    in its cell or the next ones, is a heading of the same or a higher level, or the end."""
    flat = []  # (cell, line, level or None) of every non-blank line; a code cell is one line
    for ci, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            flat += [(ci, li, _level(l)) for li, l in enumerate(_lines(cell)) if l.strip()]
        elif cell.source.strip():
            flat.append((ci, 0, None))
    found = []
    for k, (ci, li, level) in enumerate(flat):
        if level is None:
            continue
        nxt = flat[k + 1][2] if k + 1 < len(flat) else 0
        if k + 1 == len(flat) or (nxt is not None and nxt <= level):
            found.append((ci, li))
    return found


def drop_empty_headings(cells):
    """The cells without any heading that has nothing under it (and without cells left empty)."""
    while found := empty_headings(cells):
        for ci, li in reversed(found):
            lines = cells[ci].source.splitlines()
            del lines[li]
            cells[ci].source = "\n".join(lines).rstrip()
        cells = [c for c in cells if c.cell_type != "markdown" or c.source.strip()]
    return cells


def slides_copy(nb):
    """The core path, with reveal.js slide types: a slide per heading, a sub-slide per further
    markdown cell, code cells with the text above them."""
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if not {"deeper", "solution"} & set(tags(c))]
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("#"):
            kind = "slide"
        elif cell.cell_type == "markdown":
            kind = "subslide"
        else:
            kind = "-"
        cell.metadata["slideshow"] = {"slide_type": kind}
    return nb
