"""What the doctor found: `Finding`s gathered in a `Report`, rendered as text (terminal), as a
table (Jupyter) and as JSON (`--json`). Plain dataclasses: a report pickles and reloads without
torch, and its text is deterministic (no times, ports, PIDs or machine paths)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from ..course.registry import lessons
from .render import report_html, report_text
from .strategies import strategies_of

SEVERITIES = ("error", "warning", "info")


@lru_cache(maxsize=1)
def _error_classes() -> dict[str, str]:
    return {lid: lesson.error_class for lid, lesson in lessons().items() if lesson.error_class}


class _Lessons(Mapping):
    """{lesson id: the error class it teaches}, read from the registry (each `Lesson`'s
    `error_class`) the first time it is needed: importing or unpickling a report stays cheap."""

    def __getitem__(self, key: str) -> str:
        return _error_classes()[key]

    def __iter__(self):
        return iter(_error_classes())

    def __len__(self) -> int:
        return len(_error_classes())

    def __repr__(self) -> str:
        return repr(_error_classes())


LESSONS = _Lessons()


@dataclass
class Finding:
    """One thing the doctor saw, with the evidence and the fix.

    `code` names the check (e.g. "unused-parameters"); `lesson` is the lesson that teaches its
    error class; `evidence` holds short lines (names, ranks, values, PyTorch's message);
    `trace` an optional longer text (a traceback or each rank's stack), already sanitized;
    `where` the user's line the cause is on (file:line: text), when the cause is in their code."""

    severity: str
    code: str
    lesson: str
    title: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    trace: str = ""
    strategies: tuple = ()  # the strategies whose rule this is; () means STRATEGIES_OF's
    where: str = ""  # the user's line at fault, "train.py:42: loss.backward()", where it is theirs

    def __post_init__(self):
        self.strategies = tuple(self.strategies) or strategies_of(self.code)
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if self.lesson not in LESSONS:
            raise ValueError(f"lesson must be one of {', '.join(LESSONS)}, got {self.lesson!r}")

    @property
    def error_class(self) -> str:
        return LESSONS[self.lesson]

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), error_class=self.error_class, strategies=list(self.strategies))


@dataclass
class Report:
    """Every finding of one doctor run, errors first. `exit_status`: 1 with any error, else 0."""

    target: str
    world_size: int
    steps: int
    amp: str | None = None
    findings: list[Finding] = field(default_factory=list)
    status: str = "ok"  # how the ranks' run ended: ok / error / timeout / crashed / skipped
    seconds: float = 0.0  # wall time of the whole check (not shown: it varies)
    run: Any = field(default=None, repr=False, compare=False)  # the RunResult of the ranks
    ddp_kwargs: dict = field(default_factory=dict)  # the DDP settings the module was judged under
    notes: list[str] = field(default_factory=list)  # what the run assumed and did not exercise
    strategy: str = "ddp"  # the strategy the findings were judged under
    tool: str = "doctor"  # or "watch" (ddp_lab.watch: the user's own training step)

    def __post_init__(self):
        order = {s: i for i, s in enumerate(SEVERITIES)}
        self.findings.sort(key=lambda f: (order[f.severity], f.lesson, f.code))

    def of(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def errors(self) -> list[Finding]:
        return self.of("error")

    @property
    def warnings(self) -> list[Finding]:
        return self.of("warning")

    @property
    def exit_status(self) -> int:
        return 1 if self.errors else 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def lessons(self, severities=("error", "warning")) -> set[str]:
        """The lessons of the findings of these severities."""
        return {f.lesson for f in self.findings if f.severity in severities}

    def codes(self, severities=SEVERITIES) -> set[str]:
        return {f.code for f in self.findings if f.severity in severities}

    def summary(self) -> str:
        counts = [(len(self.of(s)), s) for s in SEVERITIES]
        parts = [f"{n} {s}{'' if n == 1 else 's'}" for n, s in counts if n]
        amp = f", autocast {self.amp}" if self.amp else ""
        amp += f", judged under {self.strategy}" if self.strategy != "ddp" else ""
        ddp = "".join(f", {k}={v!r}" for k, v in self.ddp_kwargs.items())
        head = (f"{self.tool}: {self.target} (world size {self.world_size}, {self.steps} "
                f"step{'' if self.steps == 1 else 's'}{amp}{ddp}, ranks {self.status})")
        return f"{head}: {', '.join(parts) if parts else 'no findings'}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "world_size": self.world_size, "steps": self.steps,
                "amp": self.amp, "strategy": self.strategy, "ddp_kwargs": self.ddp_kwargs, "status": self.status,
                "exit_status": self.exit_status, "seconds": round(self.seconds, 3),
                "notes": list(self.notes),
                "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def text(self, traces: bool = False) -> str:
        return report_text(self, traces=traces)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        return report_html(self)


def brief(line: str, limit: int = 240) -> str:
    """A long PyTorch message cut after the sentence that passes `limit` characters."""
    if len(line) <= limit:
        return line
    end = line.find(". ", limit)
    return line[:end + 1] + " [...]" if 0 < end < limit + 200 else line[:limit] + " [...]"


# The keys findings are deduplicated by: the doctor keeps one finding per code, lesson and title
# (its phases repeat what the first, more specific one said); watch one per code, title and
# line (a check may name the same mechanism at two lines of the script).
BY_TITLE = ("code", "lesson", "title")
BY_LINE = ("code", "title", "where")


def dedupe(findings: list, key: tuple = BY_TITLE) -> list:
    """One finding per `key` (names of Finding's fields): the first keeps its place."""
    seen, out = set(), []
    for f in findings:
        k = tuple(getattr(f, name) for name in key)
        if k not in seen:
            seen.add(k)
            out.append(f)
    return out
