"""The instructor guide (INSTRUCTOR.md): agendas for 90 minutes and for half a day, computed from
what was measured on each notebook (its committed execution time on 2 cores, its core-path word
count), where to demo and where attendees work alone, questions with answers, machine problems,
and the GPU node."""
from __future__ import annotations

import math
import re

from .coursebook import WORDS_PER_MINUTE, LessonNotebook, tags
from .guide_text import GPU_NODE, MACHINE_PROBLEMS, NO_QUESTIONS, QUESTIONS, SHARED_NODE

SHORT_FIRST = ("00", "01", "03", "06", "11")  # the 90-minute path: launch, sync, hang, debug, tool
SOLO_TIME = 5  # minutes attendees get for a lesson's "try it yourself"
RERUNS = 2  # each live cell runs once in the demo and about once more when someone asks
OPENING = ("Welcome; everyone's `ddp-lab check` passed; open JupyterLab", 10)
CLOSING = ("Questions; `ddp-lab doctor` on your own module; what to read next", 5)
BREAK = ("Break", 15)
_SOLO = re.compile(r"try it yourself|exercise|your turn", re.I)
_SKIP = re.compile(r"solution|going further|what the source document said", re.I)


def slot_minutes(lesson: LessonNotebook) -> int:
    """Reading time of the core path + live execution + solo time, rounded up to 5 minutes."""
    run = (lesson.execution_seconds() or 60.0) * RERUNS / 60
    return 5 * math.ceil((lesson.reading_minutes() + run + SOLO_TIME) / 5)


def demo_and_solo(lesson: LessonNotebook) -> tuple[list[str], list[str]]:
    """Section headings to live-demo, and what attendees do alone (the "try it yourself"
    sections, `exercise` cells and scenario panels)."""
    demo, solo = [], []
    for heading, cells in lesson.sections():
        if not heading or _SKIP.search(heading):
            continue
        code = [c for c in cells if c.cell_type == "code" and "deeper" not in tags(c)]
        if _SOLO.search(heading):
            solo.append(heading)
        elif code:
            demo.append(heading)
        for c in code if not _SOLO.search(heading) else []:
            if "exercise" in tags(c) or "scenario_panel(" in c.source:
                solo.append(f"{heading}: the {'panel' if 'scenario_panel(' in c.source else 'exercise'}")
    return demo, list(dict.fromkeys(solo))


def agenda(lessons: list[LessonNotebook], minutes: int, order, breaks: int = 0):
    """[(start minute, what, minutes)] filling `minutes`, and the lessons left for self-study."""
    budget = minutes - OPENING[1] - CLOSING[1] - breaks * BREAK[1]
    chosen, left = [], []
    for lesson in order(lessons):
        if slot_minutes(lesson) <= budget:
            chosen.append(lesson)
            budget -= slot_minutes(lesson)
        else:
            left.append(lesson)
    chosen.sort(key=lambda l: l.id)
    items = [OPENING] + [(f"{l.id} · {l.title}", slot_minutes(l)) for l in chosen] + [CLOSING]
    if breaks:
        items.insert(1 + (len(chosen) + 1) // 2, BREAK)
    rows, t = [], 0
    for what, length in items:
        rows.append((t, what, length))
        t += length
    return rows, sorted(left, key=lambda l: l.id)


def _short_order(lessons):
    first = [l for i in SHORT_FIRST for l in lessons if l.id == i]
    return first + [l for l in lessons if l not in first]


def _clock(minute: int) -> str:
    return f"{minute // 60}:{minute % 60:02d}"


def render_agenda(title: str, rows, left) -> list[str]:
    out = [f"### {title}", "", "| start | what | minutes |", "|---|---|---|"]
    out += [f"| {_clock(t)} | {what} | {length} |" for t, what, length in rows]
    end = rows[-1][0] + rows[-1][2]
    out += ["", f"Ends at {_clock(end)}."]
    if left:
        out += ["Left for self-study after the workshop: "
                + ", ".join(f"{l.id} ({slot_minutes(l)} min)" for l in left) + "."]
    return out + [""]


def render_figures(lessons) -> list[str]:
    out = ["| lesson | core-path words | reading (min) | execution (s) | executed (UTC) | slot (min) |",
           "|---|---|---|---|---|---|"]
    for l in lessons:
        secs = l.execution_seconds()
        out.append(f"| {l.id} · {l.title} | {l.core_words()} | {l.reading_minutes():.0f} | "
                   f"{'not recorded' if secs is None else f'{secs:.0f}'} | {l.executed_at()} | {slot_minutes(l)} |")
    return out + [""]


def render_lessons(lessons) -> list[str]:
    out = []
    for l in lessons:
        demo, solo = demo_and_solo(l)
        out += [f"### {l.id} · {l.title}", "",
                "- **Live demo:** " + ("; ".join(demo) or "the whole notebook, top to bottom"),
                "- **Attendees alone:** " + ("; ".join(solo) or "re-run the broken cell with the fix"), ""]
        qa = QUESTIONS.get(l.id)
        out += [f"- **Q:** {q}  \n  **A:** {a}" for q, a in qa] if qa else [f"- {NO_QUESTIONS}"]
        out.append("")
    return out


def render_guide(lessons: list[LessonNotebook]) -> str:
    short, short_left = agenda(lessons, 90, _short_order)
    half, half_left = agenda(lessons, 210, _short_order, breaks=1)
    lines = [
        "# Instructor guide", "",
        "Generated by `ddp-lab workshop build` from the committed notebooks; rebuild it after a "
        "notebook changes.", "",
        "## Before the day", "",
        "Ask every attendee to install the course (README, first command) and run `ddp-lab check`: "
        "one line per check, exit status 0 when all pass. Collect the failures a week ahead; the "
        "fixes are under *Machine problems* below. Give attendees `student/` (no solutions); keep "
        "`instructor/` and `slides/` for yourself.", "",
        "The slides load reveal.js (unpkg.com) and require.js (cdnjs) when opened, so they need "
        "internet. For a room without it, build the kit with npm's copies beside them: `npm "
        "install --prefix DIR reveal.js@4.0.2 requirejs@2.3.7`, then `ddp-lab workshop build OUT "
        "--slides-assets DIR/node_modules` (they go to `slides/assets/`).", "",
        "## What the agendas are built from", "",
        f"Execution time: the sum of the code cells' run times that nbclient recorded in each "
        f"committed notebook when `tools/execute_notebook.py` executed it on 2 CPU cores. Reading "
        f"time: words on the core path (markdown not tagged `deeper`) at {WORDS_PER_MINUTE} words a "
        f"minute. A lesson's slot is reading time + {RERUNS} x execution time + {SOLO_TIME} minutes "
        f"alone, rounded up to 5 minutes. A notebook executed while the machine was busy records "
        f"longer times: before a workshop, re-execute the notebooks on a quiet machine and rebuild.", "",
    ] + render_figures(lessons) + ["## Agendas", ""]
    lines += render_agenda("90 minutes", short, short_left)
    lines += render_agenda("Half a day (3 h 30, one break)", half, half_left)
    lines += ["## Lesson by lesson: demo, solo work, questions", ""] + render_lessons(lessons)
    lines += ["## Machine problems", "", "| problem | what attendees see | fix |", "|---|---|---|"]
    lines += [f"| {p} | {s} | {f} |" for p, s, f in MACHINE_PROBLEMS]
    lines += ["", "## On a GPU node (`backend=\"nccl\"`)", "", GPU_NODE]
    lines += ["## On a shared node", "", SHARED_NODE]
    return "\n".join(lines)
