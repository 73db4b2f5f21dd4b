"""Write the table of the registry's checks into the docs, from the registry itself
(ddp_lab/doctor/checks: each `Check`'s mechanism, codes with their levels, lesson and notes), so
the table never says what the code does not.

    .venv/bin/python tools/check_table.py           # rewrite the tables in docs/watch.md, docs/doctor.md
    .venv/bin/python tools/check_table.py --check   # exit 1 when a committed table is stale

Each table stands between `<!-- checks: TOOL -->` and `<!-- end checks -->`, one row per
mechanism: a check whose `mechanism` is a sentence has one; a check that declares several (a
sequence of objects or dicts with `what`, `codes` and `notes`, as issue 43 plans) has one row
each, with its own codes and notes. tests/doctor/checks/test_check_table.py fails on a stale one.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = {"watch": ROOT / "docs" / "watch.md", "doctor": ROOT / "docs" / "doctor.md"}
BEGIN, END = "<!-- checks: {tool} -->", "<!-- end checks -->"
HEAD = ["| check | what it judges | findings (the most severe level) | lesson | what it does not see |",
        "|---|---|---|---|---|"]


def _field(obj, name, default=None):
    return obj.get(name, default) if isinstance(obj, dict) else getattr(obj, name, default)


def mechanisms(check) -> list[tuple[str, dict, tuple]]:
    """(what it judges, {code: level}, notes) per mechanism of `check`."""
    if isinstance(check.mechanism, str):
        return [(check.mechanism, dict(check.codes), tuple(check.notes))]
    return [(_field(m, "what", ""), dict(_field(m, "codes", {}) or {}), tuple(_field(m, "notes", ()) or ()))
            for m in check.mechanism]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def rows(tool: str, registry=None) -> list[str]:
    if registry is None:
        from ddp_lab.doctor.checks import registry as found
        registry = found()
    out = []
    for name, check in registry.items():
        if tool not in check.tools:
            continue
        for what, codes, notes in mechanisms(check):
            findings = ", ".join(f"`{c}` ({level})" for c, level in codes.items())
            out.append(f"| {name} | {_cell(what)} | {findings} | {check.lesson} | "
                       f"{_cell('; '.join(notes)) or '-'} |")
    return out


def table(tool: str, registry=None) -> str:
    return "\n".join([BEGIN.format(tool=tool), *HEAD, *rows(tool, registry), END])


def rewritten(text: str, tool: str, registry=None) -> str:
    """`text` with its table of `tool`'s checks made anew (it must have the markers once)."""
    pattern = re.compile(re.escape(BEGIN.format(tool=tool)) + r".*?" + re.escape(END), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"the markers {BEGIN.format(tool=tool)} ... {END} must be there once")
    return pattern.sub(lambda _: table(tool, registry), text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when a committed table is stale")
    args = p.parse_args(argv)
    stale = []
    for tool, path in DOCS.items():
        text = path.read_text()
        new = rewritten(text, tool)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print("stale tables of checks (run tools/check_table.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    print(("rewritten: " if stale else "up to date: ") + ", ".join(stale or DOCS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
