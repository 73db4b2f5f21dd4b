"""Checkers for the "try it yourself" cells: run the learner's code on real ranks through a
scenario's fixed variant, and say whether it meets the fixed variant's declared outcome."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .registry import Scenario
from ..launching.results import RunResult


@dataclass
class Verdict:
    passed: bool
    scenario: str
    problems: list[str] = field(default_factory=list)
    result: RunResult | None = None

    def __repr__(self) -> str:
        if self.passed:
            return f"✓ {self.scenario}: your version behaves as the fix must ({self.result.status} on every rank)."
        lines = [f"✗ {self.scenario}: not yet."] + [f"  - {p.splitlines()[0]}" for p in self.problems]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        colour = "#27ae60" if self.passed else "#c0392b"
        body = html.escape(repr(self)).replace("\n", "<br>")
        details = "\n\n".join(p for p in self.problems if "\n" in p)
        if details:
            body += (f"<details><summary>details</summary><pre>{html.escape(details)}</pre>"
                     "</details>")
        return f'<div style="border-left:4px solid {colour};padding:4px 8px">{body}</div>'


def try_fix(scenario: Scenario, *, fn=None, world_size: int | None = None,
          timeout: float | None = None, **kwargs) -> Verdict:
    """Run `scenario`'s fixed variant with `kwargs` replaced by the learner's (e.g. their module
    class), or the learner's own per-rank function `fn` (called with `kwargs` only), on real
    ranks, and compare with what the fixed variant must do.

    Where the lesson's bug is a hang, an attempt that still hangs is stopped after the broken
    variant's (short) timeout rather than the fixed one's."""
    variant = scenario.fixed.with_kwargs(**kwargs)
    if fn is not None:
        variant = replace(variant, fn=fn, kwargs=kwargs)
    if timeout is None and scenario.broken.expect.status == "timeout":
        timeout = scenario.broken.timeout
    result = variant.run(world_size=world_size, timeout=timeout, label=f"{scenario.key} yours")
    problems = variant.expect.differences(result)
    return Verdict(not problems, scenario.key, problems, result)
