"""The tour: every scenario of every lesson, broken then fixed, on real ranks; a table of what
happened against what is declared, and each lesson's figures as PNG files."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from .registry import Lesson, Scenario, lessons
from ..launching.results import RunResult


@dataclass
class Row:
    scenario: Scenario
    broken: RunResult
    fixed: RunResult
    problems: list[str]

    @property
    def as_declared(self) -> bool:
        return not self.problems


def _outcome(result: RunResult) -> str:
    root = result.root_cause
    if root is None:
        return "ok"
    what = root.error.type if root.status == "error" and root.error else root.headline
    return f"{result.status}: rank {root.rank} {what}"[:46]


def run_scenario(scenario: Scenario, world_size: int | None = None) -> Row:
    results = {v: scenario.run(v, world_size=world_size) for v in ("broken", "fixed")}
    problems = [f"{v}: {p}" for v, r in results.items() for p in scenario.differences(v, r)]
    return Row(scenario, results["broken"], results["fixed"], problems)


def write_figures(lesson: Lesson, rows: list[Row], out: Path) -> list[Path]:
    if lesson.figures is None:
        return []
    results = {r.scenario.name: {"broken": r.broken, "fixed": r.fixed} for r in rows}
    written = []
    try:
        drawn = lesson.figures(results)
    except Exception as exc:  # noqa: BLE001 - a run the figure needs failed: the table says which
        if all(r.as_declared for r in rows):
            raise
        print(f"lesson {lesson.id}: figures not drawn ({type(exc).__name__}: {exc}); a scenario "
              "they draw is not as declared", file=sys.stderr)
        return []
    for name, fig in drawn.items():
        path = out / f"{lesson.id}_{name}.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


def format_table(rows: list[Row]) -> str:
    lines = [f"{'lesson':<6} {'scenario':<30} {'broken':<47} {'fixed':<8} as declared?"]
    for r in rows:
        mark = "yes" if r.as_declared else "NO"
        lines.append(f"{r.scenario.lesson:<6} {r.scenario.name:<30} {_outcome(r.broken):<47} "
                     f"{_outcome(r.fixed):<8} {mark}")
    return "\n".join(lines)


def tour(out: str | Path = "ddp-lab-tour", only: list[str] | None = None, progress: bool = True,
         stream=None) -> list[Row]:
    """Run every scenario of the chosen lessons (all: None) broken and fixed, print the table to
    `stream` (sys.stdout as it is when called), write each lesson's figures into `out`."""
    from tqdm import tqdm

    stream = stream or sys.stdout
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [l for k, l in lessons().items() if not only or k in only]
    for lesson in chosen:  # e.g. lesson 12 builds DeepSpeed's C++ op here, never in a rank
        if lesson.prepare is not None:
            lesson.prepare()
    total = sum(len(l.scenarios) for l in chosen)
    rows: list[Row] = []
    figures: list[Path] = []
    with tqdm(total=total, desc="tour", unit="scenario", disable=not progress, file=sys.stderr) as bar:
        for lesson in chosen:
            lesson_rows = []
            for scenario in lesson.scenarios:
                bar.set_postfix_str(scenario.key)
                lesson_rows.append(run_scenario(scenario))
                bar.update()
            rows += lesson_rows
            figures += write_figures(lesson, lesson_rows, out)
    print(format_table(rows), file=stream)
    for r in rows:
        for p in r.problems:
            print(f"NOT AS DECLARED {r.scenario.key} {p}", file=stream)
    print(f"\n{sum(r.as_declared for r in rows)}/{len(rows)} scenarios as declared; "
          f"{len(figures)} figures written to {out}/", file=stream)
    return rows
