"""The lesson registry: every scenario declared once, with its broken and fixed variants and the
outcome each must have. Notebooks, the CLI, the tour, the doctor and the tests all read it.

A lesson is a module (or package) `ddp_lab.lessons.lNN_<name>` that defines `LESSON = Lesson(...)`.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..launching.results import STATUSES, RunResult

VARIANTS = ("broken", "fixed")


@dataclass(frozen=True)
class Expect:
    """The outcome a variant must have.

    status "error":   `ranks` (default: the root-cause rank) raised `error_type` whose message
                      matches `match` (a regular expression; a plain fragment works).
                      Where builds of torch raise different errors for the same mistake,
                      `error_type` names each, "RuntimeError|ValueError", and `match` too.
    status "timeout": `ranks` (default: any rank) timed out with `match` in its stack.
    status "crashed": `ranks` (default: any rank) crashed, `match` in its headline
                      (e.g. "SIGSEGV", "status 3").
    status "ok":      every rank ok.
    With `metric`, the value rank `metric_rank` returned (a dict) must have `metric` above
    `above` and/or below `below` (`metric_rank=None`: the largest over all ranks).
    `extra` is the lesson's own test of the run: RunResult -> list of problems (empty: met).
    `condition` says in words what `extra` checks (the CLI prints it); without it, the words
    are the check's own docstring (or that of the function that made it, with its arguments).
    """

    status: str
    error_type: str | None = None
    match: str | None = None
    ranks: tuple[int, ...] | None = None
    metric: str | None = None
    above: float | None = None
    below: float | None = None
    metric_rank: int | None = 0
    extra: Callable[[RunResult], list[str]] | None = None
    condition: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: use one of {', '.join(STATUSES)}")

    def assert_met(self, result: RunResult) -> RunResult:
        """Raise AssertionError naming every difference unless `result` is as declared;
        return `result` so a cell can go on with it."""
        problems = self.differences(result)
        if problems:
            raise AssertionError(f"not as declared ({self.describe()}): " + "; ".join(problems))
        return result

    def describe(self) -> str:
        parts = [self.status]
        if self.error_type:
            parts.append(self.error_type)
        if self.match:
            parts.append(f"/{self.match}/")
        if self.ranks is not None:
            parts.append(f"on rank{'s' if len(self.ranks) > 1 else ''} "
                         + ",".join(map(str, self.ranks)))
        if self.metric:
            bound = [f"> {self.above:g}" if self.above is not None else "",
                     f"< {self.below:g}" if self.below is not None else ""]
            parts.append(f"{self.metric} {' '.join(b for b in bound if b)}")
        return " ".join(parts)

    def condition_text(self) -> str:
        """describe(), and what `extra` checks in words: the whole declared condition."""
        if not self.extra:
            return self.describe()
        return f"{self.describe()}; {self.condition or _check_words(self.extra)}"

    def measured(self, result: RunResult) -> list[str]:
        """The figure the declaration reads from `result`, beside its threshold: `metric`'s
        value (empty without a metric, or when the ranks returned none)."""
        if not self.metric:
            return []
        try:
            value = self._metric_value(result)
        except (KeyError, TypeError, ValueError, IndexError):
            return []
        where = (" (the largest over the ranks)" if self.metric_rank is None
                 else f" on rank {self.metric_rank}")
        bounds = ([f"> {self.above:g}"] if self.above is not None else []) + \
                 ([f"< {self.below:g}"] if self.below is not None else [])
        return [f"{self.metric} = {value:.4g}{where}; declared {' and '.join(bounds)}"]

    def _metric_value(self, result: RunResult) -> float:
        if self.metric_rank is None:
            return max(float(v[self.metric]) for v in result.values if v is not None)
        return float(result.ranks[self.metric_rank].value[self.metric])

    def differences(self, result: RunResult) -> list[str]:
        """What differs between `result` and this declaration; empty when it is as declared."""
        if result.status != self.status:
            return [f"status {result.status!r}, expected {self.status!r}: {result.describe_failure()}"]
        problems: list[str] = []
        if self.status in ("error", "timeout", "crashed"):
            problems += self._failure_differences(result)
        if self.metric:
            problems += self._metric_differences(result)
        if self.extra:
            problems += list(self.extra(result))
        return problems

    def _failure_differences(self, result: RunResult) -> list[str]:
        if self.ranks is not None:
            targets = [result.ranks[r] for r in self.ranks if r < result.world_size]
        elif self.status == "error":
            targets = [result.root_cause]
        else:
            targets = [r for r in result.ranks if r.status == self.status][:1]
        problems = []
        for r in targets:
            if r.status != self.status:
                problems.append(f"rank {r.rank} is {r.status!r}, expected {self.status!r}")
                continue
            if (self.status == "error" and self.error_type
                    and r.error.type not in self.error_type.split("|")):
                problems.append(f"rank {r.rank} raised {r.error.type}, expected {self.error_type}")
            text = {"error": r.error.message if r.error else "", "timeout": r.stack,
                    "crashed": r.headline + "\n" + r.stderr}[self.status]
            if self.match and not re.search(self.match, text):
                problems.append(f"rank {r.rank}: /{self.match}/ not found in its "
                                f"{ {'error': 'error message', 'timeout': 'stack', 'crashed': 'crash report'}[self.status]}")
        return problems

    def _metric_differences(self, result: RunResult) -> list[str]:
        try:
            value = self._metric_value(result)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            return [f"no metric {self.metric!r} in the ranks' values ({exc!r})"]
        problems = []
        if self.above is not None and not value > self.above:
            problems.append(f"{self.metric} = {value:.4g}, expected > {self.above:g}")
        if self.below is not None and not value < self.below:
            problems.append(f"{self.metric} = {value:.4g}, expected < {self.below:g}")
        return problems


@dataclass(frozen=True)
class Measured:
    """How often a variant's declared outcome held on one torch release where it does not hold
    every time: in `held` of `runs` runs, counted by `command`. Only such a measurement lets the
    upgrade check (tools/upgrade_check.py) set a miss of that declaration aside, in a bucket of its
    own ("known nondeterministic on this build"); on any other release, and for any variant
    without one, a miss fails as before. `torch` is a release, "2.14.1", or a series, "2.14"."""

    torch: str
    held: int
    runs: int
    command: str

    def __post_init__(self):
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.torch):
            raise ValueError(f"Measured.torch is a release such as '2.14.1' or '2.14', got {self.torch!r}")
        if not 0 < self.held < self.runs:
            raise ValueError(f"Measured: held {self.held} of {self.runs} runs is not a rate between "
                             "0 and 1 (a declaration that always holds needs none; one that never "
                             "holds is wrong)")
        if not self.command.strip():
            raise ValueError("Measured.command: say how the rate was counted, so it can be counted again")

    def applies_to(self, version: str) -> bool:
        """Whether `version` (torch.__version__, local tag and all) is this release or series."""
        release = version.split("+")[0]
        return release == self.torch or release.startswith(self.torch + ".")

    def describe(self) -> str:
        return f"holds in {self.held} of {self.runs} runs on torch {self.torch} ({self.command})"


def _check_words(check: Callable) -> str:
    """An `extra` check in words: its maker's name with the plain arguments it was given (a
    closure, a functools.partial), else the first sentence of its docstring (or its maker's). A
    check that says itself what it holds (an attribute `condition`, as lesson 18's do) is read."""
    if isinstance(getattr(check, "condition", None), str) and check.condition:
        return check.condition
    func = getattr(check, "func", check)  # a functools.partial: the function it binds
    qualname = getattr(func, "__qualname__", type(func).__name__)  # maker.<locals>.check
    name = qualname.rsplit(".<locals>.", 1)[0].split(".<locals>.")[-1]  # the innermost maker
    given = dict(getattr(check, "keywords", None) or {})
    if check is func and hasattr(func, "__code__"):
        given = {k: c.cell_contents for k, c in zip(func.__code__.co_freevars, func.__closure__ or ())}
    args = [f"{k}={v!r}" for k, v in given.items() if isinstance(v, (int, float, str))]
    if args:
        return f"the lesson's check {name.lstrip('_')}({', '.join(args)})"
    maker = getattr(inspect.getmodule(func), name, None)
    doc = " ".join((inspect.getdoc(func) or inspect.getdoc(maker) or "").split())
    first = doc.removeprefix("Extra check: ").split(". ")[0].rstrip(".")
    return f"the lesson's check {name.lstrip('_')}" + (f": {first}" if first else "")


@dataclass(frozen=True)
class Variant:
    """One way to run a scenario: a per-rank function, its keyword arguments, launch options,
    and the declared outcome."""

    fn: Callable[..., Any]
    expect: Expect
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    world_size: int = 2
    timeout: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    init_process_group: bool = True
    grace: float = 5.0
    start_method: str = "auto"
    # where the declared outcome holds only some of the time on a torch release (see Measured)
    measured: tuple[Measured, ...] = ()

    def measured_on(self, version: str) -> Measured | None:
        """This variant's measured rate on torch `version`, if one is declared."""
        return next((m for m in self.measured if m.applies_to(version)), None)

    def assert_declared(self, result: RunResult) -> RunResult:
        """Raise AssertionError unless `result` has this variant's declared outcome."""
        return self.expect.assert_met(result)

    def with_kwargs(self, **kwargs) -> "Variant":
        """The same variant with some arguments replaced (e.g. the learner's own module)."""
        return replace(self, kwargs={**self.kwargs, **kwargs})

    def run(self, *, world_size: int | None = None, timeout: float | None = None,
            label: str = "", **kwargs) -> RunResult:
        from ..launching.launcher import launch

        # No warm server needed: each rank's timeout counts from when that rank is ready.
        return environment_checked(launch(
            self.fn, world_size=world_size or self.world_size, timeout=timeout or self.timeout,
            env=dict(self.env), init_process_group=self.init_process_group, grace=self.grace,
            start_method=self.start_method, label=label, **{**self.kwargs, **kwargs}))


def environment_checked(result: RunResult) -> RunResult:
    """`result`, unless a rank found that this environment cannot run the scenario at all
    (DeepSpeed's op not built for it: OpBuildError, naming `ddp-lab build-ops`): then that is an
    error of the run, raised here, not an outcome to hold against the scenario's declaration."""
    from ..instruments.deepspeed_ops import OpBuildError

    for r in result.ranks:
        if r.error is not None and r.error.type == OpBuildError.__name__:
            raise OpBuildError(f"{result.label or 'the run'}, rank {r.rank}: {r.error.message}")
    return result


@dataclass(frozen=True)
class ModuleCase:
    """For scenarios whose bug lives in the module itself: how the doctor builds and feeds it.
    `broken` / `fixed` are module classes or zero-argument factories; `input(rank)` returns the
    example batch (a tensor or a tuple of positional arguments) for that rank. The doctor must
    flag `broken` with a finding (error or warning) whose lesson is the scenario's lesson, and
    give `fixed` no error-level finding."""

    broken: Callable[[], Any]
    fixed: Callable[[], Any]
    input: Callable[[int], Any]
    amp: str | None = None  # "bf16" / "fp16" when the bug shows only under autocast
    strategy: str = "ddp"  # "fsdp2" / "zero3" when the bug shows only with the module sharded
    compile: bool = False  # True when the bug shows only under torch.compile (the doctor's --compile)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    broken: Variant
    fixed: Variant
    summary: str = ""  # one line: what goes wrong, and the fix
    module: ModuleCase | None = None  # set when the bug lives in the module (the doctor uses it)
    lesson: str = ""  # filled in by the Lesson that lists the scenario

    @property
    def key(self) -> str:
        return f"{self.lesson}/{self.name}"

    def variant(self, which: str) -> Variant:
        if which not in VARIANTS:
            raise ValueError(f"unknown variant {which!r}: use 'broken' or 'fixed'")
        return getattr(self, which)

    def run(self, which: str = "broken", **kwargs) -> RunResult:
        return self.variant(which).run(label=f"{self.key} {which}", **kwargs)

    def differences(self, which: str, result: RunResult) -> list[str]:
        """What differs between `result` and the outcome declared for `which`; empty when
        the run behaved as declared."""
        return self.variant(which).expect.differences(result)

    def assert_declared(self, which: str, result: RunResult) -> RunResult:
        """Raise AssertionError (naming every difference) unless `result` has the outcome
        declared for `which` ("broken": the failure it must show; "fixed": its success).
        Returns `result`, so a cell can go on with it."""
        problems = self.differences(which, result)
        if problems:
            raise AssertionError(f"{self.key} {which} is not as declared: " + "; ".join(problems))
        return result


@dataclass
class Lesson:
    id: str
    title: str
    notebook: str
    scenarios: list[Scenario]
    # results[scenario name][variant] -> RunResult  ==>  {figure name: matplotlib Figure}
    figures: Callable[[Mapping[str, Mapping[str, RunResult]]], dict[str, Any]] | None = None
    error_class: str = ""  # a few words: the class of error it teaches (the doctor names it)
    # run once in the calling process before the lesson's scenarios (the tour calls it): e.g.
    # build a C++ op, have the fork server preload what the ranks import
    prepare: Callable[[], Any] | None = None

    def __post_init__(self):
        if not re.fullmatch(r"\d\d", self.id):
            raise ValueError(f"a lesson id is two digits, got {self.id!r}")
        for s in self.scenarios:
            if s.lesson not in ("", self.id):
                raise ValueError(f"scenario {s.name!r} names lesson {s.lesson!r} but is listed "
                                 f"in lesson {self.id}")
        self.scenarios = [replace(s, lesson=self.id) for s in self.scenarios]

    def scenario(self, name: str) -> Scenario:
        for s in self.scenarios:
            if s.name == name:
                return s
        names = ", ".join(s.name for s in self.scenarios)
        raise KeyError(f"lesson {self.id} has no scenario {name!r}; it has: {names}")


def lessons() -> dict[str, Lesson]:
    """Every lesson in ddp_lab.lessons, by id, in order."""
    from .. import lessons as pkg

    found = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if re.fullmatch(r"l\d\d_\w+", info.name):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            lesson = getattr(mod, "LESSON", None)
            if lesson is not None:
                found[lesson.id] = lesson
    return found


def lessons_folder() -> str:
    """The folder the lessons are discovered in."""
    from .. import lessons as pkg

    return pkg.__path__[0]


def get_lesson(lesson_id: str) -> Lesson:
    all_lessons = lessons()
    key = lesson_id.zfill(2) if lesson_id.isdigit() else lesson_id
    if key not in all_lessons:
        raise KeyError(f"no lesson {lesson_id!r}; lessons: {', '.join(all_lessons)}")
    return all_lessons[key]


def get_scenario(lesson_id: str, name: str) -> Scenario:
    return get_lesson(lesson_id).scenario(name)
