"""Every lesson in the registry has its notebook, and its README row; every
numbered notebook belongs to a lesson (11_doctor is the doctor's walkthrough, not a scenario
lesson)."""
import re

import pytest

from conftest import REPO as ROOT
from ddp_lab.course.registry import lessons

LESSONS = lessons()
NOT_IN_REGISTRY = {"11_doctor"}


@pytest.mark.parametrize("lesson_id", sorted(LESSONS))
def test_lesson_has_notebook_readme_row_and_tests(lesson_id):
    lesson = LESSONS[lesson_id]
    assert lesson.notebook.startswith(f"{lesson_id}_"), lesson.notebook
    assert (ROOT / "notebooks" / f"{lesson.notebook}.ipynb").is_file(), \
        f"lesson {lesson_id} has no notebooks/{lesson.notebook}.ipynb"
    row = f"| {lesson_id} | [{lesson.notebook}](notebooks/{lesson.notebook}.ipynb) |"
    assert row in (ROOT / "README.md").read_text(), f"README.md has no row {row!r}"
    assert lesson.error_class, f"lesson {lesson_id} names no error_class"
    assert all(s.lesson == lesson_id for s in lesson.scenarios)


def test_every_notebook_is_a_lesson():
    declared = {l.notebook for l in LESSONS.values()} | NOT_IN_REGISTRY
    found = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb") if re.match(r"\d\d_", p.name)}
    assert found - declared == set(), f"notebooks without a registry lesson: {found - declared}"


def test_every_notebook_title_reads_lesson_nn():
    """One form for every title ("Lesson 00 · ..." as "Lesson 13 · ..."): the site, the slides and
    the workshop guide show them side by side."""
    import json

    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        first = json.loads(path.read_text())["cells"][0]
        heading = "".join(first["source"]).splitlines()[0]
        assert first["cell_type"] == "markdown" and heading.startswith(f"# Lesson {path.name[:2]} · "), \
            (path.name, heading)


def test_the_source_document_is_said_where_it_first_appears():
    """The README's lesson table and notebook 00's first cell name "the source document": each
    says what it is there, not only in lesson 00's section 5."""
    import json

    readme = (ROOT / "README.md").read_text()
    said = readme.index("*The source document* is the text this course grew from")
    assert said < readme.index("the source document's own example")
    nb00 = json.loads((ROOT / "notebooks" / "00_launching_ranks.ipynb").read_text())
    first = "".join(nb00["cells"][0]["source"])
    assert "the source document" in first and "*The source document* is the text this course grew from" in first
