"""`ddp-lab workshop build OUT`: the workshop kit, built from the committed notebooks' tags.

    OUT/student/       every lesson without its `solution` cells, `exercise` outputs cleared
    OUT/instructor/    the full notebooks
    OUT/slides/        reveal.js slides of each lesson's core path (nbconvert)
    OUT/INSTRUCTOR.md  the instructor guide (ddp_lab.guide)

The kit is written to a temporary folder next to OUT and moved into place at the end, so a
failure leaves no half-built kit behind.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from .coursebook import lesson_notebooks, slides_copy, student_copy
from .guide import render_guide

PARTS = ("student", "instructor", "slides", "INSTRUCTOR.md")


def write_slides(nb, path: Path) -> None:
    """reveal.js HTML of `nb`'s core path. reveal.js itself loads from a CDN when opened."""
    from nbconvert import SlidesExporter

    body, _ = SlidesExporter().from_notebook_node(slides_copy(nb))
    path.write_text(body, encoding="utf-8")


def build_workshop(out, notebooks="notebooks") -> Path:
    """Build the kit into `out` (replacing the parts of an earlier build); returns `out`."""
    out = Path(out)
    lessons = lesson_notebooks(notebooks)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".workshop-", dir=out))
    try:
        for part in ("student", "instructor", "slides"):
            (tmp / part).mkdir()
        for lesson in lessons:
            nbformat.write(lesson.nb, tmp / "instructor" / lesson.path.name)
            nbformat.write(student_copy(lesson.nb), tmp / "student" / lesson.path.name)
            write_slides(lesson.nb, tmp / "slides" / f"{lesson.stem}.slides.html")
        (tmp / "INSTRUCTOR.md").write_text(render_guide(lessons), encoding="utf-8")
        for part in PARTS:
            target = out / part
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            (tmp / part).rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"workshop kit for {len(lessons)} lessons in {out}/: " + ", ".join(PARTS))
    return out
