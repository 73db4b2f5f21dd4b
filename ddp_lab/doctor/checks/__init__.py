"""The checks' one registry, shared by the doctor and watch: a check is one module of this
package defining `CHECK = Check(...)` (api.py: its mechanism, the finding codes it gives with
their severity, the lesson teaching the error class, the tools and strategies it serves, its
failing and passing test, what it does not see). `registry()` finds them all; a tool judges
them through `judge(name, ev)` or `judge_all(tool, ev)`.

    def attach(ctx): ...   # watch, on each rank, before the user's script runs: hooks, ctx.add/emit
    def judge(ev): ...     # in the parent: the ranks' records (ev.ranks), the launch (ev.run)
    CHECK = Check(name="samples", mechanism="which samples each rank trains on", lesson="07",
                  codes={"sample-on-several-ranks": "warning"}, attach=attach, judge=judge,
                  tests="tests/doctor/checks/test_samples.py")

Modules whose name starts with "_" are a check's own parts (its judge, its helpers); api.py and
context.py are the floor every check stands on. Adding a check: one file here and one test file
(its `tests`); tests/doctor/checks/test_checks_registry.py holds every check to that shape, and
tools/check_table.py writes the docs' table of checks from the registry."""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ..strategies import strategies_of
from .api import TOOLS, Check  # noqa: F401 - TOOLS: the tools a check may name

FLOOR = ("api", "context")  # not checks: what every check imports
BROKEN: dict[str, str] = {}  # module -> why it did not import (tests/doctor/checks/test_checks_registry.py fails on any)


@lru_cache(maxsize=None)
def registry() -> dict[str, Check]:
    """name -> Check, for every module of this package that defines CHECK, by name. A check
    module that fails to import is left out and named in BROKEN (one check's bug must not take
    watch or the doctor down; the registry's test fails on it)."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name in FLOOR:
            continue
        try:
            module = importlib.import_module(f"{__name__}.{info.name}")
        except Exception as exc:  # noqa: BLE001
            BROKEN[info.name] = f"{type(exc).__name__}: {exc}"
            continue
        check = getattr(module, "CHECK", None)
        if isinstance(check, Check):
            found.append(check)
    return {c.name: c for c in sorted(found, key=lambda c: c.name)}


def checks_for(tool: str) -> list[Check]:
    return [c for c in registry().values() if tool in c.tools]


def judge(name: str, ev) -> list:
    """The findings of check `name` on `ev`, each its check's strategies' rule unless it names
    its own (Check.strategies)."""
    check = registry()[name]
    found = list(check.judge(ev) or [])
    if check.strategies:
        for f in found:
            if f.strategies == strategies_of(f.code):
                f.strategies = tuple(check.strategies)
    return found


def judge_all(tool: str, ev, names=None) -> tuple[list, list[str]]:
    """(findings, notes) of every check of `tool` (or those in `names`): a check whose judge
    fails, or that did not import, is said in a note; the others' findings stand."""
    found, notes = [], []
    for check in checks_for(tool):
        if names is not None and check.name not in names:
            continue
        try:
            found += judge(check.name, ev)
        except Exception as exc:  # noqa: BLE001 - one check's bug must not hide the others
            notes.append(f"check {check.name} failed on this run ({type(exc).__name__}: {exc}); "
                         "its findings are missing")
    notes += [f"check {name} is missing: it did not import ({why})" for name, why in BROKEN.items()]
    return found, notes
