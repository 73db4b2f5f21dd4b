"""Score a tool on the corpus (tests/corpus/<tool>/*/: broken.py, fixed.py, case.toml): per case,
whether the broken version is caught by one of the case's `codes` at error or warning level,
whether a catching finding's `where` names the fault line, and whether the fixed version has
any error- or warning-level finding (a false alarm); then a per-mechanism table.

    .venv/bin/python tools/corpus_score.py doctor            # every doctor case
    .venv/bin/python tools/corpus_score.py doctor 20 23      # the cases whose folder starts so

A tool is scored by a runner: `RUNNERS[tool](case, variant) -> list of findings` (objects with
severity, code and where). `register(tool, runner)` adds one (watch's is added the same way).
case.toml, for the doctor:

    title = "..."; cites = ["https://..."]; mechanism = "tp_parallelize"
    codes = ["tp-output-differs"]
    fault = "model.head.weight = model.embed.weight"   # a unique substring of broken.py's line
    target = "Net"                  # module class or zero-argument factory in the file
    input = "torch.randint(0, 32, (4, 8))"
    parallelize = "parallelize"     # optional: a function (model, mesh) in the file
    [options]                       # doctor(...) keyword arguments
    strategy = "tp"
"""
from __future__ import annotations

import argparse
import os
import sys
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "corpus"))
RUNNERS: dict[str, Callable] = {}
LOUD = ("error", "warning")
# Where watch's reports on corpus scripts may already exist, made elsewhere in the same session
# with the case's own arguments: each a function (script's real path) -> Report or None. The
# test suite adds the notebooks' (tests/conftest.py): a notebook that runs a corpus script.
MADE_ELSEWHERE: list[Callable] = []


@dataclass
class Case:
    tool: str
    name: str  # the folder's name
    folder: str
    spec: dict

    @property
    def mechanism(self) -> str:
        return self.spec["mechanism"]

    def fault_line(self) -> int:
        """The line number of broken.py holding `fault` (exactly one line must)."""
        with open(os.path.join(self.folder, "broken.py")) as f:
            hits = [i for i, line in enumerate(f, 1) if self.spec["fault"] in line]
        if len(hits) != 1:
            raise ValueError(f"{self.name}: fault {self.spec['fault']!r} is on lines {hits} of "
                             "broken.py; it must name exactly one")
        return hits[0]


@dataclass
class Score:
    case: Case
    caught: bool
    named: bool
    false_alarms: list = field(default_factory=list)  # "code: title" of the fixed version's
    seen: list = field(default_factory=list)  # the broken version's loud findings, "code where"


def cases(tool: str, only: tuple = ()) -> list[Case]:
    base = os.path.join(ROOT, tool)
    found = []
    for name in sorted(os.listdir(base)):
        folder = os.path.join(base, name)
        toml = os.path.join(folder, "case.toml")
        if os.path.isfile(toml) and (not only or any(name.startswith(o) for o in only)):
            with open(toml, "rb") as f:
                found.append(Case(tool, name, folder, tomllib.load(f)))
    return found


def register(tool: str, runner: Callable) -> None:
    RUNNERS[tool] = runner


def score(case: Case) -> Score:
    run = RUNNERS[case.tool]
    broken, fixed = run(case, "broken"), run(case, "fixed")
    hits = [f for f in broken if f.code in case.spec["codes"] and f.severity in LOUD]
    line = case.fault_line()
    named = any(f.where.startswith(f"broken.py:{line}:") for f in hits)
    return Score(case, bool(hits), named,
                 [f"{f.code}: {f.title}" for f in fixed if f.severity in LOUD],
                 [f"{f.severity} {f.code} {f.where}" for f in broken if f.severity in LOUD])


def run_doctor(case: Case, variant: str) -> list:
    """The doctor on one version of a case, as its CLI loads a file (ddp_lab/doctor/loader.py)."""
    return doctor_report(os.path.join(case.folder, f"{variant}.py")).findings


def doctor_call(script: str) -> tuple:
    """(target, example input, keyword options): the doctor's call on a corpus file, from its
    case.toml (target, input, parallelize, [options]), the file loaded as its CLI loads one."""
    from ddp_lab.doctor.loader import eval_input, load_file

    folder = os.path.dirname(os.path.abspath(script))
    with open(os.path.join(folder, "case.toml"), "rb") as f:
        spec = tomllib.load(f)
    module = load_file(script)
    options = dict(spec.get("options", {}))
    if spec.get("parallelize"):
        options["parallelize"] = getattr(module, spec["parallelize"])
    if isinstance(options.get("tp_plan"), str) and options["tp_plan"] != "traced":
        options["tp_plan"] = eval_input(options["tp_plan"], vars(module), "tp_plan")
    return getattr(module, spec["target"]), eval_input(spec["input"], vars(module)), options


def doctor_report(script: str):
    """The doctor's Report on a corpus file (its case's target, input and options), once per
    process: the corpus test, the checks' own tests and the README's commands share the runs
    (one per file, however its path is spelled)."""
    return _doctor_report(os.path.realpath(script))


@lru_cache(maxsize=None)
def _doctor_report(script: str):
    from ddp_lab.doctor import doctor

    target, example, options = doctor_call(script)
    return doctor(target, example, **options)


register("doctor", run_doctor)


def run_watch(case: Case, variant: str) -> list:
    """watch on one version of a case: the script unchanged on `nproc` real ranks, as
    `ddp-lab watch [--timeout T] broken.py ARGS` runs it, with every check attached."""
    return watch_report(os.path.join(case.folder, f"{variant}.py")).findings


def watch_call(script: str) -> dict:
    """watch_script's arguments for a corpus script, from its case.toml: args, nproc, timeout."""
    with open(os.path.join(os.path.dirname(os.path.abspath(script)), "case.toml"), "rb") as f:
        spec = tomllib.load(f)
    return {"args": list(spec.get("args", [])), "nproc": spec.get("nproc", 2),
            "timeout": spec.get("timeout", 60)}


def watch_report(script: str):
    """The Report of watch on a corpus script (its case's args, nproc and timeout), once per
    process: the corpus test, the checks' own tests (tests/doctor/checks) and the README's
    commands share the runs (one per file, however its path is spelled)."""
    return _watch_report(os.path.realpath(script))


@lru_cache(maxsize=None)
def _watch_report(script: str):
    from ddp_lab.doctor.watch.script_mode import watch_script

    for source in MADE_ELSEWHERE:
        if (report := source(script)) is not None:
            return report
    call = watch_call(script)
    return watch_script(script, call["args"], nproc=call["nproc"], timeout=call["timeout"])


register("watch", run_watch)


def table(scores: list[Score]) -> str:
    """Per mechanism: cases, caught, line named, false alarms; then the totals."""
    rows: dict[str, list[Score]] = {}
    for s in scores:
        rows.setdefault(s.case.mechanism, []).append(s)
    lines = ["| mechanism | cases | caught | line named | false alarms (fixed) |", "|---|---|---|---|---|"]
    for mech, group in sorted(rows.items()):
        lines.append(f"| {mech} | {len(group)} | {sum(s.caught for s in group)} | "
                     f"{sum(s.named for s in group)} | {sum(bool(s.false_alarms) for s in group)} |")
    lines.append(f"| all | {len(scores)} | {sum(s.caught for s in scores)} | "
                 f"{sum(s.named for s in scores)} | {sum(bool(s.false_alarms) for s in scores)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", choices=sorted(RUNNERS))
    parser.add_argument("only", nargs="*", help="folder name prefixes (default: every case)")
    args = parser.parse_args(argv)
    scores = []
    for case in cases(args.tool, tuple(args.only)):
        s = score(case)
        scores.append(s)
        verdict = ("caught" if s.caught else "MISSED") + (", line named" if s.named else "")
        alarms = f"; fixed: {'; '.join(s.false_alarms)}" if s.false_alarms else ""
        print(f"{case.name}: {verdict}{alarms}", flush=True)
        if not s.caught or not s.named:
            print("   broken gave: " + ("; ".join(s.seen) or "nothing loud"), flush=True)
    print(table(scores))
    return 0 if all(s.caught and not s.false_alarms for s in scores) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
