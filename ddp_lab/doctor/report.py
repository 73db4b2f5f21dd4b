"""What the doctor found: `Finding`s gathered in a `Report`, rendered as text (terminal), as a
table (Jupyter) and as JSON (`--json`). Plain dataclasses: a report pickles and reloads without
torch, and its text is deterministic (no times, ports, PIDs or machine paths)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")
# The error class each lesson teaches (COURSE.md numbering; the CLI and the issues use it too).
LESSONS = {
    "01": "parameter registration", "02": "device and dtype",
    "03": "process groups and deadlocks", "04": "mixed precision",
    "05": "gradients and checkpointing", "06": "logging and debugging",
    "07": "data across ranks", "08": "buffers and BatchNorm",
    "09": "saving and loading", "10": "gradient accumulation",
    "14": "randomness and evaluation",
}


@dataclass
class Finding:
    """One thing the doctor saw, with the evidence and the fix.

    `code` names the check (e.g. "unused-parameters"); `lesson` is the lesson that teaches its
    error class; `evidence` holds short lines (names, ranks, values, PyTorch's message);
    `trace` an optional longer text (a traceback or each rank's stack), already sanitized."""

    severity: str
    code: str
    lesson: str
    title: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    trace: str = ""

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")
        if self.lesson not in LESSONS:
            raise ValueError(f"lesson must be one of {', '.join(LESSONS)}, got {self.lesson!r}")

    @property
    def error_class(self) -> str:
        return LESSONS[self.lesson]

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), error_class=self.error_class)


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
        head = (f"doctor: {self.target} (world size {self.world_size}, {self.steps} "
                f"step{'' if self.steps == 1 else 's'}{amp}, ranks {self.status})")
        return f"{head}: {', '.join(parts) if parts else 'no findings'}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "world_size": self.world_size, "steps": self.steps,
                "amp": self.amp, "status": self.status, "exit_status": self.exit_status,
                "seconds": round(self.seconds, 3),
                "findings": [f.to_dict() for f in self.findings]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def text(self, traces: bool = False) -> str:
        from .render import report_text

        return report_text(self, traces=traces)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        from .render import report_html

        return report_html(self)
