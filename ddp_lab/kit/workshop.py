"""`ddp-lab workshop build OUT`: the workshop kit, built from the committed notebooks' tags.

    OUT/student/       every lesson without its `solution` cells, `exercise` outputs cleared
    OUT/instructor/    the full notebooks
    OUT/slides/        reveal.js slides of each lesson's core path (nbconvert); reveal.js and
                       require.js from CDNs, or with --slides-assets from npm's copies in
                       OUT/slides/assets/, for a room without internet
    OUT/INSTRUCTOR.md  the instructor guide (ddp_lab.guide)

The kit is written to a temporary folder inside OUT and moved into place at the end
(kit/staging.py), so a failure leaves no half-built kit behind.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from .coursebook import lesson_notebooks, slides_copy, student_copy
from .guide import render_guide
from .staging import staged

PARTS = ("student", "instructor", "slides", "INSTRUCTOR.md")


# What the slides load when opened: by default from CDNs (unpkg, cdnjs), or, for a room without
# internet, from copies of npm's packages beside them (`--slides-assets`).
ASSETS = {"reveal.js": ("dist/reveal.js", "dist/reveal.css", "plugin/notes/notes.js"),
          "requirejs": ("require.js",)}
COPIED = ("reveal.js/dist", "reveal.js/plugin/notes", "requirejs/require.js")  # 3.5 MB of 6.5
ASSETS_HOW = ("npm install --prefix DIR reveal.js@4.0.2 requirejs@2.3.7, then pass "
              "--slides-assets DIR/node_modules")


def validate_assets(folder) -> Path:
    """`folder` (an npm node_modules) has reveal.js and requirejs, or a ValueError names what
    is missing and how to get it."""
    folder = Path(folder)
    missing = [f"{pkg}/{f}" for pkg, files in ASSETS.items() for f in files
               if not (folder / pkg / f).is_file()]
    if missing:
        raise ValueError(f"--slides-assets {folder}: missing {', '.join(missing)}; {ASSETS_HOW}")
    return folder


def write_slides(nb, path: Path, offline: bool = False) -> None:
    """reveal.js HTML of `nb`'s core path. reveal.js and require.js load from CDNs when opened,
    or (`offline`) from `assets/` beside the slides."""
    from nbconvert import SlidesExporter

    exporter = SlidesExporter()
    if offline:
        exporter.reveal_url_prefix = "assets/reveal.js"
        exporter.require_js_url = "assets/requirejs/require.js"
    body, _ = exporter.from_notebook_node(slides_copy(nb))
    path.write_text(body, encoding="utf-8")


def _copy_assets(assets: Path, slides: Path) -> None:
    for part in COPIED:
        target = slides / "assets" / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if (assets / part).is_dir():
            shutil.copytree(assets / part, target)
        else:
            shutil.copy(assets / part, target)


def build_workshop(out, notebooks="notebooks", slides_assets=None) -> Path:
    """Build the kit into `out` (replacing the parts of an earlier build); returns `out`.
    `slides_assets`: an npm node_modules with reveal.js and requirejs, copied beside the
    slides so they work offline."""
    out = Path(out)
    assets = validate_assets(slides_assets) if slides_assets else None
    lessons = lesson_notebooks(notebooks)
    with staged(out, ".workshop-") as tmp:
        for part in ("student", "instructor", "slides"):
            (tmp / part).mkdir()
        for lesson in lessons:
            nbformat.write(lesson.nb, tmp / "instructor" / lesson.path.name)
            nbformat.write(student_copy(lesson.nb), tmp / "student" / lesson.path.name)
            write_slides(lesson.nb, tmp / "slides" / f"{lesson.stem}.slides.html", bool(assets))
        if assets:
            _copy_assets(assets, tmp / "slides")
        (tmp / "INSTRUCTOR.md").write_text(render_guide(lessons), encoding="utf-8")
    print(f"workshop kit for {len(lessons)} lessons in {out}/: " + ", ".join(PARTS))
    return out
