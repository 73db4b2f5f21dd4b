"""`ddp-lab workshop build OUT`: student and instructor notebooks, slides and the guide, from
the notebooks' tags and the figures measured on them."""
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from conftest import REPO as ROOT
from ddp_lab.cli import main
from ddp_lab.kit.coursebook import empty_headings, lesson_notebooks, student_copy, tags
from ddp_lab.kit.guide import agenda, _short_order, slot_minutes



def _cell(kind, source, *tag_names, output=None):
    cell = new_code_cell(source) if kind == "code" else new_markdown_cell(source)
    cell.metadata["tags"] = list(tag_names)
    if output:
        cell.outputs = [new_output("stream", name="stdout", text=output)]
        cell.metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00.000000Z",
                                      "shell.execute_reply": "2026-01-01T00:00:02.500000Z"}
    return cell


def tagged_notebook():
    return new_notebook(cells=[
        _cell("md", "# Lesson 98 · A tagged lesson\n\nOne two three."),
        _cell("code", "print('run')", output="run\n"),
        _cell("md", "## 1 · Try it yourself"),
        _cell("code", "fix_me()", "exercise", output="not yet\n"),
        _cell("md", "## Going further\n\nSecond reading words.", "deeper"),
        _cell("md", "## Solutions"),
        _cell("code", "THE_SOLUTION = 1", "solution", output="done\n"),
    ])


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    src = tmp_path_factory.mktemp("notebooks")
    for name in ("10_gradient_accumulation.ipynb", "11_doctor.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, src / name)
    nbformat.write(tagged_notebook(), src / "98_tagged.ipynb")
    out = tmp_path_factory.mktemp("kit")
    assert main(["workshop", "build", str(out), "--notebooks", str(src)]) == 0
    return out


def test_students_get_no_solutions_and_cleared_exercises(kit):
    student = nbformat.read(kit / "student" / "98_tagged.ipynb", as_version=4)
    assert not [c for c in student.cells if "solution" in tags(c) or "Solutions" in c.source]
    exercise = next(c for c in student.cells if "exercise" in tags(c))
    assert exercise.outputs == [] and exercise.execution_count is None
    assert student.cells[1].outputs[0].text == "run\n"  # the rest stays executed


def test_instructors_get_the_full_notebooks(kit):
    for path in (ROOT / "notebooks").glob("1[01]_*.ipynb"):
        assert (kit / "instructor" / path.name).read_text() == path.read_text()
    full = nbformat.read(kit / "instructor" / "98_tagged.ipynb", as_version=4)
    assert any("solution" in tags(c) for c in full.cells)


def test_slides_are_reveal_js_of_the_core_path(kit):
    slides = sorted(p.name for p in (kit / "slides").iterdir())
    assert slides == ["10_gradient_accumulation.slides.html", "11_doctor.slides.html", "98_tagged.slides.html"]
    text = (kit / "slides" / "98_tagged.slides.html").read_text()
    assert "reveal" in text and "A tagged lesson" in text and "fix_me" in text
    assert "THE_SOLUTION" not in text and "Second reading words" not in text


def test_the_guide_has_agendas_from_measured_figures_and_the_day_s_problems(kit):
    guide = (kit / "INSTRUCTOR.md").read_text()
    for needed in ("### 90 minutes", "### Half a day", "--allow-root", "WSL", "proxy", "2-core",
                   'backend="nccl"', "**Q:**", "Live demo:", "Attendees alone:", "`ddp-lab check`",
                   "`ddp-lab build-ops`", "OpBuildError", "C++ compiler", "Python headers", "g++ python3-dev"):
        assert needed in guide, needed


def test_the_guide_says_what_a_shared_node_isolates_and_what_it_does_not(kit):
    guide = (kit / "INSTRUCTOR.md").read_text()
    shared = guide.split("## On a shared node", 1)[1]
    for needed in ("`tempfile.mkdtemp`: mode 0700", "socketpair", "`TCPStore` on 127.0.0.1",
                   "no password", "GLOO_SOCKET_IFNAME=lo", "`cores // world size`",
                   "CUDA_VISIBLE_DEVICES", "`users` line warns"):
        assert needed in shared, needed
    # 98: 13 words off the `deeper` and `solution` cells; three code cells recorded 2.5 s each
    # (7.5 s); 0.1 min reading + 2 x 7.5 s + 5 min alone -> a 10-minute slot
    assert "| 98 · A tagged lesson | 13 | 0 | 8 | 2026-01-01 00:00 | 10 |" in guide
    assert "Attendees alone:** 1 · Try it yourself" in guide


def test_every_committed_lesson_loses_only_its_solutions():
    for lesson in lesson_notebooks(ROOT / "notebooks"):
        student = student_copy(lesson.nb)
        assert not [c for c in student.cells if "solution" in tags(c)], lesson.stem
        kept = [c for c in lesson.nb.cells if not {"solution", "exercise"} & set(tags(c))]
        assert sum(len(c.get("outputs", [])) for c in kept) == \
            sum(len(c.get("outputs", [])) for c in student.cells if "exercise" not in tags(c))


def _headings_with_nothing_under(nb) -> list[str]:
    """Independent of the kit's own finder: each markdown heading line, and what comes after it."""
    items = []  # ("h", level, text) or ("x", 0, text), in reading order
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            items += [("x", 0, "code")] if cell.source.strip() else []
            continue
        fenced = False
        for line in cell.source.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            heading = not fenced and re.match(r"(#+) ", line)
            if heading:
                items.append(("h", len(heading.group(1)), line))
            elif line.strip():
                items.append(("x", 0, line))
    return [text for i, (kind, level, text) in enumerate(items) if kind == "h" and
            (i + 1 == len(items) or (items[i + 1][0] == "h" and items[i + 1][1] <= level))]


def test_no_student_notebook_keeps_a_heading_with_nothing_under_it():
    for lesson in lesson_notebooks(ROOT / "notebooks"):
        assert _headings_with_nothing_under(student_copy(lesson.nb)) == [], lesson.stem


def test_empty_headings_are_found_within_and_across_cells():
    cells = [_cell("md", "# Top\n\ntext\n\n## Empty"), _cell("md", "## Next\n### Sub\n\nbody"),
             _cell("md", "## Fence\n```\n# not a heading\n```"), _cell("md", "## Last")]
    assert empty_headings(cells) == [(0, 4), (3, 0)]


def test_the_agendas_fit_their_time_from_the_committed_notebooks():
    lessons = lesson_notebooks(ROOT / "notebooks")
    assert all(l.execution_seconds() for l in lessons), "a notebook without recorded timing"
    for minutes, breaks in ((90, 0), (210, 1)):
        rows, left = agenda(lessons, minutes, _short_order, breaks=breaks)
        assert rows[-1][0] + rows[-1][2] <= minutes
        assert len(rows) - 2 - breaks + len(left) == len(lessons)
        assert all(slot_minutes(l) % 5 == 0 for l in lessons)


def test_a_missing_notebook_folder_is_named(tmp_path, capsys):
    assert main(["workshop", "build", str(tmp_path / "out"), "--notebooks", str(tmp_path / "nope")]) == 2
    assert "no notebook folder" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _assets(folder: Path) -> Path:
    """The files --slides-assets needs, as `npm install reveal.js@4.0.2 requirejs` lays them out
    (contents beside the point here: the slides were rendered offline in Chromium by hand)."""
    for name in ("reveal.js/dist/reveal.js", "reveal.js/dist/reveal.css",
                 "reveal.js/dist/theme/simple.css", "reveal.js/plugin/notes/notes.js",
                 "requirejs/require.js"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("/* stand-in */")
    return folder


def test_offline_slides_load_reveal_and_require_from_beside_them(tmp_path):
    notebooks = tmp_path / "nb"
    notebooks.mkdir()
    nbformat.write(tagged_notebook(), notebooks / "98_tagged.ipynb")
    out = tmp_path / "kit"
    assert main(["workshop", "build", str(out), "--notebooks", str(notebooks),
                 "--slides-assets", str(_assets(tmp_path / "node_modules"))]) == 0
    slides = (out / "slides" / "98_tagged.slides.html").read_text()
    assert "unpkg.com/reveal.js" not in slides and "require.js/2.1.10" not in slides
    assert '"assets/reveal.js/dist/reveal.js"' in slides and 'src="assets/requirejs/require.js"' in slides
    assert (out / "slides" / "assets" / "reveal.js" / "dist" / "theme" / "simple.css").is_file()
    assert "--slides-assets DIR/node_modules" in (out / "INSTRUCTOR.md").read_text()


def test_missing_slides_assets_are_named_and_nothing_is_built(tmp_path, capsys):
    (tmp_path / "node_modules" / "reveal.js").mkdir(parents=True)
    out = tmp_path / "kit"
    assert main(["workshop", "build", str(out), "--slides-assets", str(tmp_path / "node_modules")]) == 2
    err = capsys.readouterr().err
    assert "missing reveal.js/dist/reveal.js" in err and "requirejs/require.js" in err
    assert "npm install --prefix DIR reveal.js@4.0.2 requirejs@2.3.7" in err
    assert not out.exists()


def test_a_staged_build_replaces_its_parts_whole_or_changes_nothing(tmp_path):
    from ddp_lab.kit.staging import staged

    out = tmp_path / "out"
    (out / "part").mkdir(parents=True)
    (out / "part" / "old.txt").write_text("old")
    (out / "keep.txt").write_text("kept")
    with pytest.raises(RuntimeError):
        with staged(out, ".t-") as tmp:
            (tmp / "part").mkdir()
            raise RuntimeError("the build failed")
    assert (out / "part" / "old.txt").exists() and sorted(p.name for p in out.iterdir()) == ["keep.txt", "part"]
    with staged(out, ".t-") as tmp:
        (tmp / "part").mkdir()
        (tmp / "part" / "new.txt").write_text("new")
        (tmp / "page.html").write_text("page")
    assert [p.name for p in (out / "part").iterdir()] == ["new.txt"]  # replaced whole
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "page.html", "part"]
