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
# with the same call: each a function (script's real path, args, nproc, timeout, reference) ->
# Report or None. The test suite adds the notebooks' (tests/conftest.py): a notebook that runs
# a corpus script.
MADE_ELSEWHERE: list[Callable] = []


@dataclass
class Case:
    tool: str
    name: str  # the folder's name
    folder: str
    spec: dict

    @property
    def mechanism(self) -> str:
        """The mechanism as the case's author named it (a blind author, in their own words)."""
        return self.spec["mechanism"]

    @property
    def check(self) -> str:
        """The check meant for the mechanism: `check` (a blind case, assigned when it was scored),
        else `mechanism` (a case written beside its check names the check)."""
        return self.spec.get("check") or self.spec["mechanism"]

    @property
    def blind(self) -> bool:
        """Written by an author who never read the checks (../shared/CORPUS.md's brief)."""
        return bool(self.spec.get("blind"))

    def codes(self) -> list[str]:
        """The codes that catch it: the case's own `codes`, else every code of its check (none
        while the check meant for it does not exist yet)."""
        if "codes" in self.spec:
            return list(self.spec["codes"])
        from ddp_lab.doctor.checks import registry

        check = registry().get(self.check)
        return list(check.codes) if check else []

    def second_defect(self, finding) -> bool:
        """Whether `finding` (on fixed.py) is the one case.toml's [second_defect] declares: a
        defect the author's fixed script keeps besides the one the case is about (`code`, at
        `where`, the start of the finding's place, e.g. "fixed.py:53:"; `test`, the test that
        shows the defect real on real ranks; `why`). Not a false alarm: watch is right to warn.
        The case stays as written."""
        declared = self.spec.get("second_defect")
        return bool(declared) and finding.code == declared["code"] and \
            finding.where.startswith(declared["where"])

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
    # loud findings on the fixed version that case.toml's [second_defect] declares: a true
    # finding of another defect its author's fixed script keeps, shown real by a test of its own
    second: list = field(default_factory=list)
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
    codes = case.codes()
    hits = [f for f in broken if f.code in codes and f.severity in LOUD]
    line = case.fault_line()
    named = any(f.where.startswith(f"broken.py:{line}:") for f in hits)
    loud = [f for f in fixed if f.severity in LOUD]
    second = [f for f in loud if case.second_defect(f)]
    return Score(case, bool(hits), named,
                 false_alarms=[f"{f.code}: {f.title}" for f in loud if f not in second],
                 second=[f"{f.code} at {f.where}" for f in second],
                 seen=[f"{f.severity} {f.code} {f.where}" for f in broken if f.severity in LOUD])


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
    """watch_script's arguments for a corpus script, from its case.toml: args, nproc, timeout,
    reference (--reference's steps for a case of that class, else None)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(script)), "case.toml"), "rb") as f:
        spec = tomllib.load(f)
    return {"args": list(spec.get("args", [])), "nproc": spec.get("nproc", 2),
            "timeout": spec.get("timeout", 60),
            "reference": REFERENCE_STEPS if is_reference(spec) else None}


def watch_report(script: str):
    """The Report of watch on a corpus script (its case's args, nproc and timeout), once per
    process: the corpus test, the checks' own tests (tests/doctor/checks) and the README's
    commands share the runs."""
    call = watch_call(script)
    return watch_run(script, tuple(call["args"]), call["nproc"], call["timeout"], call["reference"])


REFERENCE_STEPS = 3  # --reference's default


def is_reference(spec: dict) -> bool:
    """A case run under `--reference` (issue 45): its check is "reference", or it is of the class
    only a one-process run tells (`reference_class = true`)."""
    return spec.get("check") == "reference" or bool(spec.get("reference_class"))


def watch_run(script: str, args: tuple, nproc: int, timeout: float, reference: int | None = None):
    """`ddp-lab watch --nproc-per-node NPROC --timeout T [--reference-steps K] script ARGS`'s
    Report, once per process and call: one per file however its path is spelled (its real path
    is the key), taken from MADE_ELSEWHERE where the same call was made there."""
    return _watch_run(os.path.realpath(script), tuple(args), nproc, timeout, reference)


@lru_cache(maxsize=None)
def _watch_run(script: str, args: tuple, nproc: int, timeout: float, reference: int | None):
    from ddp_lab.doctor.watch.script import watch_script

    for source in MADE_ELSEWHERE:
        if (report := source(script, args, nproc, timeout, reference)) is not None:
            return report
    return watch_script(script, list(args), nproc=nproc, timeout=timeout, reference=reference)


register("watch", run_watch)


def table(scores: list[Score]) -> str:
    """Per check meant for the cases: cases, caught, line named, false alarms; then the totals."""
    rows: dict[str, list[Score]] = {}
    for s in scores:
        rows.setdefault(s.case.check, []).append(s)
    lines = ["| check | cases | caught | line named | false alarms (fixed) |", "|---|---|---|---|---|"]
    for mech, group in sorted(rows.items()):
        lines.append(f"| {mech} | {len(group)} | {sum(s.caught for s in group)} | "
                     f"{sum(s.named for s in group)} | {sum(bool(s.false_alarms) for s in group)} |")
    lines.append(f"| all | {len(scores)} | {sum(s.caught for s in scores)} | "
                 f"{sum(s.named for s in scores)} | {sum(bool(s.false_alarms) for s in scores)} |")
    return "\n".join(lines)


def tables(scores: list[Score]) -> str:
    """The blind cases and the cases written beside their check, apart: only the first says how
    watch fares on bugs nobody showed it; then issue 45's class under --reference."""
    out = []
    for blind, title in ((True, "blind (written by authors who never read the checks)"),
                         (False, "beside (each written with the check meant for it)")):
        group = [s for s in scores if s.case.blind == blind]
        if group:
            out += [f"{title}:", table(group)]
            out += [f"{s.case.name}: fixed.py keeps a second defect, found (not a false alarm): "
                    f"{'; '.join(s.second)}" for s in group if s.second]
            out.append("")
    out.append(reference_table(scores))
    return "\n".join(out).rstrip()


def reference_table(scores: list[Score]) -> str:
    """The cases of issue 45's class (`reference_class = true`), run under --reference: caught by
    the reference check's codes (whatever check is meant), its line named, its false alarms."""
    group = [s for s in scores if s.case.spec.get("reference_class")]
    if not group or s_codes("reference") is None:
        return ""
    codes = s_codes("reference")
    lines = ["reference class (issue 45, under --reference): caught by the reference check:",
             "| case | caught | line named | false alarms (fixed) |", "|---|---|---|---|"]
    for s in group:
        hits = [x.split(" ", 2) for x in s.seen if x.split(" ", 2)[1] in codes]
        line = s.case.fault_line()
        named = any(len(h) > 2 and h[2].startswith(f"broken.py:{line}:") for h in hits)
        alarms = [a for a in s.false_alarms if a.split(":", 1)[0] in codes]
        lines.append(f"| {s.case.name} | {'yes' if hits else 'no'} | {'yes' if named else 'no'} | "
                     f"{len(alarms)} |")
    return "\n".join(lines)


def s_codes(check: str) -> list | None:
    from ddp_lab.doctor.checks import registry

    found = registry().get(check)
    return list(found.codes) if found else None


# --- the control set: correct scripts in the shape of public ones, and their upstream bugs ----

@dataclass
class ControlRun:
    """One run of the control set (tests/corpus/control/<shape>/): correct.py (with its args or a
    variant's) must give no error or warning; a bug_<name>.py must be caught at its fault line."""

    shape: str  # the folder's name
    label: str  # "correct", "variant <name>" or "bug <name>"
    script: str
    args: tuple
    nproc: int
    table: dict  # the case.toml table it comes from (a bug's: title, cites, fault, evidence)

    @property
    def is_bug(self) -> bool:
        return self.label.startswith("bug ")

    def fault_line(self) -> int:
        with open(self.script) as f:
            hits = [i for i, line in enumerate(f, 1) if self.table["fault"] in line]
        if len(hits) != 1:
            raise ValueError(f"{self.shape} {self.label}: fault on lines {hits}; it must name one")
        return hits[0]


def control_runs(only: tuple = ()) -> list[ControlRun]:
    base = os.path.join(ROOT, "control")
    out = []
    for shape in sorted(os.listdir(base)):
        toml = os.path.join(base, shape, "case.toml")
        if not os.path.isfile(toml) or (only and not any(shape.startswith(o) for o in only)):
            continue
        with open(toml, "rb") as f:
            spec = tomllib.load(f)
        folder, nproc, args = os.path.join(base, shape), spec.get("nproc", 2), spec.get("args", [])
        out.append(ControlRun(shape, "correct", os.path.join(folder, "correct.py"), tuple(args), nproc, spec))
        for name, t in spec.get("variants", {}).items():
            out.append(ControlRun(shape, f"variant {name}", os.path.join(folder, "correct.py"),
                                  tuple(t.get("args", [])), nproc, t))
        for name, t in spec.get("bugs", {}).items():
            out.append(ControlRun(shape, f"bug {name}", os.path.join(folder, f"bug_{name}.py"),
                                  tuple(t.get("args", args)), nproc, t))
    return out


def control_verdict(run: ControlRun) -> tuple[bool, list[str]]:
    """(as it must be, the loud findings): a correct run quiet; a bug caught at its fault line."""
    report = watch_run(run.script, run.args, run.nproc, CONTROL_TIMEOUT)
    loud = [f for f in report.findings if f.severity in LOUD]
    seen = [f"{f.severity} {f.code} {f.where}" for f in loud]
    if not run.is_bug:
        return not loud, seen
    at = f"{os.path.basename(run.script)}:{run.fault_line()}:"
    return any(f.where.startswith(at) for f in loud), seen


CONTROL_TIMEOUT = 120


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", choices=sorted(RUNNERS) + ["control"])
    parser.add_argument("only", nargs="*", help="folder name prefixes (default: every case)")
    args = parser.parse_args(argv)
    if args.tool == "control":
        return control_main(tuple(args.only))
    scores = []
    for case in cases(args.tool, tuple(args.only)):
        s = score(case)
        scores.append(s)
        verdict = ("caught" if s.caught else "MISSED") + (", line named" if s.named else "")
        alarms = f"; fixed: {'; '.join(s.false_alarms)}" if s.false_alarms else ""
        alarms += (f"; fixed: a second defect its author kept, found: {'; '.join(s.second)}"
                   if s.second else "")
        print(f"{case.name}: {verdict}{alarms}", flush=True)
        if not s.caught or not s.named:
            print("   broken gave: " + ("; ".join(s.seen) or "nothing loud"), flush=True)
    print(tables(scores))
    return 0 if all(s.caught and not s.false_alarms for s in scores) else 1


def control_main(only: tuple) -> int:
    good = 0
    runs = control_runs(only)
    for run in runs:
        ok, seen = control_verdict(run)
        good += ok
        want = "caught at its line" if run.is_bug else "quiet"
        print(f"{run.shape} {run.label}: {'as it must be' if ok else 'NOT ' + want}"
              + ("" if ok and not run.is_bug else f" ({'; '.join(seen) or 'nothing loud'})"), flush=True)
    quiet = [r for r in runs if not r.is_bug]
    print(f"correct runs quiet: {sum(control_verdict(r)[0] for r in quiet)} of {len(quiet)}; "
          f"bugs caught at their line: {good - sum(control_verdict(r)[0] for r in quiet)} of {len(runs) - len(quiet)}")
    return 0 if good == len(runs) else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
