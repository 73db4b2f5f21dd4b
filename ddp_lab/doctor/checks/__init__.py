"""The checks' one registry, shared by the doctor and watch: a check is one module of this
package defining `CHECK = Check(...)` (its mechanism, the finding codes it gives with their
severity, the lesson teaching the error class, the tools and strategies it serves, and its
failing and passing test). `registry()` finds them all; watch's script mode attaches and
judges every check whose `tools` name it.

    def attach(ctx): ...   # on each rank, before the user's script runs: hooks, ctx.add/emit
    def judge(ev): ...     # in the parent: the ranks' records (ev.ranks), the launch (ev.run)
    CHECK = Check(name="samples", mechanism="which samples each rank trains on", lesson="07",
                  codes={"sample-on-several-ranks": "warning"}, attach=attach, judge=judge,
                  tests="tests/doctor/checks/test_samples.py")

Adding a check: one file here and one test file (its `tests`); tests/doctor/checks/
test_checks_registry.py holds every check to that shape."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

TOOLS = ("watch", "doctor")


@dataclass(frozen=True)
class Check:
    name: str  # the module's name
    mechanism: str  # one line: what it judges (the README's per-mechanism table)
    lesson: str  # the lesson that teaches the error class
    codes: dict  # finding code -> the most severe level it is given at
    judge: Callable  # judge(evidence) -> list[Finding]
    attach: Callable | None = None  # attach(ctx) on each rank of a script run
    tools: tuple = ("watch",)
    strategies: tuple = ("ddp", "fsdp2")
    tests: str = ""  # the test file holding its failing and passing tests
    order: int = 50  # judged in this order (lower first): a check may defer to an earlier one
    notes: tuple = field(default=())  # what it does not see, said in the README

    def __post_init__(self):
        bad = [t for t in self.tools if t not in TOOLS]
        if bad:
            raise ValueError(f"check {self.name}: tools must be among {TOOLS}, got {bad}")
        levels = {"error", "warning", "info"}
        if not self.codes or any(v not in levels for v in self.codes.values()):
            raise ValueError(f"check {self.name}: codes must map each code to one of {sorted(levels)}")


BROKEN: dict[str, str] = {}  # module -> why it did not import (tests/doctor/checks/test_checks_registry.py fails on any)


@lru_cache(maxsize=None)
def registry() -> dict[str, Check]:
    """name -> Check, for every module of this package that defines CHECK, in judging order.
    A check module that fails to import is left out and named in BROKEN (one check's bug must
    not take watch or the doctor down; the registry's test fails on it)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:  # noqa: BLE001
            BROKEN[info.name] = f"{type(exc).__name__}: {exc}"
            continue
        check = getattr(module, "CHECK", None)
        if isinstance(check, Check):
            found.append(check)
    return {c.name: c for c in sorted(found, key=lambda c: (c.order, c.name))}


def checks_for(tool: str) -> list[Check]:
    return [c for c in registry().values() if tool in c.tools]
