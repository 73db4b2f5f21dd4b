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
