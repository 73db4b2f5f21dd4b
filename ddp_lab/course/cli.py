"""The course's subcommands of `ddp-lab`: list, run, tour, build-ops."""
from __future__ import annotations

import shutil
import sys
import textwrap
import threading
from contextlib import contextmanager

from ..launching import sanitize
from ..launching.rankinfo import in_torchrun, rank_info
from .registry import VARIANTS, get_lesson, lessons


def add_commands(sub) -> None:
    sub.add_parser("list", help="every lesson and scenario").set_defaults(func=list_scenarios)
    run = sub.add_parser("run", help="run a lesson's scenarios on real ranks and check them")
    run.add_argument("lesson", help="lesson id, e.g. 00")
    run.add_argument("scenario", nargs="?", help="one scenario (default: all of the lesson)")
    run.add_argument("--variant", choices=VARIANTS, help="default: broken, then fixed")
    run.add_argument("--world-size", type=int, default=None)
    run.add_argument("--output", action="store_true", help="print every rank's stdout")
    run.set_defaults(func=run_scenarios)
    tour = sub.add_parser("tour", help="every scenario broken then fixed; a table and the figures")
    tour.add_argument("--out", default="ddp-lab-tour", help="folder for the PNG figures")
    tour.add_argument("--lesson", action="append", default=[], help="only this lesson (repeatable)")
    tour.add_argument("--quiet", action="store_true", help="no progress bar")
    tour.set_defaults(func=run_tour)
    ops = sub.add_parser("build-ops", help="build DeepSpeed's C++ op once (lesson 12 needs it)")
    ops.add_argument("--timeout", type=float, default=1800.0, help="give up after this many s")
    ops.set_defaults(func=build_ops)


def list_scenarios(args) -> int:
    for lesson in lessons().values():
        print(f"{lesson.id}  {lesson.title}  (notebooks/{lesson.notebook}.ipynb)")
        for s in lesson.scenarios:
            print(f"      {s.name:<32} {s.title}")
    return 0


def run_scenarios(args) -> int:
    """Each scenario's variants on real ranks, each against its declaration; progress (scenario,
    variant, elapsed) on stderr when it is a terminal; one line of summary at the end."""
    from tqdm import tqdm

    lesson = get_lesson(args.lesson)
    scenarios = [lesson.scenario(args.scenario)] if args.scenario else lesson.scenarios
    variants = [args.variant] if args.variant else list(VARIANTS)
    runs = [(s, which) for s in scenarios for which in variants]
    not_declared: list[str] = []
    with tqdm(total=len(runs), desc=f"lesson {lesson.id}", unit="run", file=sys.stderr,
              disable=not sys.stderr.isatty(), bar_format=_BAR) as bar:
        for scenario, which in runs:
            if which == variants[0] and not in_torchrun():  # what the scenario is, once: e.g.
                # 16/simulated_world runs on one real rank and simulates 64 (issue 38, point 8)
                _emit(bar, f"{scenario.key}: {scenario.title}")
            bar.set_postfix_str(f"{scenario.name} {which}")
            with _ticking(bar):
                result = scenario.run(which, world_size=args.world_size)
            if in_torchrun():  # this process is one rank of torchrun's group: report it alone
                r, info = result.ranks[0], rank_info()
                local = f" (local rank {info.local_rank})" if info.local_rank != info.rank else ""
                print(f"[rank {info.rank}] {scenario.key} {which}: {r.status} {r.headline}{local}")
                if r.status != scenario.variant(which).expect.status:
                    not_declared.append(f"{scenario.key} {which}")
                continue
            problems = scenario.differences(which, result)
            _emit(bar, report(scenario, which, result, problems, args.output))
            if problems:
                not_declared.append(f"{scenario.key} {which}")
            bar.update()
    if not in_torchrun():
        print(summary(len(scenarios), variants, not_declared))
    return 1 if not_declared else 0


@contextmanager
def _ticking(bar, every: float = 1.0):
    """Redraw the bar every second while a run goes on: tqdm redraws only when it counts one,
    and one run can take a minute."""
    stop = threading.Event()
    ticker = threading.Thread(target=lambda: [bar.refresh() for _ in iter(lambda: stop.wait(every), True)],
                              name="ddp-lab-progress", daemon=True)
    if not bar.disable:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker.is_alive():
            ticker.join()


_BAR = "{desc}: {n_fmt}/{total_fmt} runs, {elapsed}{postfix}"


def report(scenario, which: str, result, problems: list[str], output: bool = False) -> str:
    """What `ddp-lab run` prints for one run: the per-rank table, what was measured against
    what is declared, and whether the run is as declared."""
    expect = scenario.variant(which).expect
    lines = [repr(result)]
    if result.ok and expect.status == "ok":  # nothing failed: a measured figure decides
        lines += [f"  measured: {m}" for m in expect.measured(result)]
        other = [o for o in VARIANTS if o != which][0]
        if scenario.variant(other).expect.status == "ok":  # the other variant is measured too
            unlike = scenario.differences(other, result)  # the cross-check: these should differ
            lines += [f"  as intended, the {other} variant's declaration does not hold here: {p}"
                      for p in unlike] or [
                f"  also meets the {other} variant's declaration: nothing tells them apart"]
    lines.append(f"  declared: {expect.condition_text()}  ->  "
                 + ("as declared" if not problems else "NOT as declared"))
    lines += [f"  - {p}" for p in problems]
    if any(r.steps for r in result.ranks):  # the ranks marked steps: what they cost
        lines.append(str(result.costs()))
    if output and (printed := result.output("stdout")):
        lines.append(sanitize(printed).rstrip("\n"))
    return "\n".join(lines)


def summary(n_scenarios: int, variants: list[str], not_declared: list[str]) -> str:
    """The last line of `ddp-lab run`."""
    runs = " and ".join(variants)
    head = f"{n_scenarios} scenario{'s' if n_scenarios != 1 else ''} run {runs}"
    if not not_declared:
        return f"{head}: all as declared"
    return f"{head}: {len(not_declared)} NOT as declared: {', '.join(not_declared)}"


def _emit(bar, text: str) -> None:
    """Print above the progress bar; on a terminal, long lines wrap at spaces, never inside a
    name (a terminal cuts a line at its last column, wherever that falls)."""
    if sys.stdout.isatty():
        text = wrap(text, shutil.get_terminal_size().columns)
    bar.write(text, file=sys.stdout)


def wrap(text: str, width: int) -> str:
    """Each line of `text` cut at spaces to `width` columns; a continuation is indented 4 more
    than its line; a word longer than the line stays whole."""
    out = []
    for line in text.splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(line, max(width - 1, 20), subsequent_indent=indent,
                             break_long_words=False, break_on_hyphens=False,
                             drop_whitespace=True, replace_whitespace=False) or [""]
    return "\n".join(out)


def run_tour(args) -> int:
    from .tour import tour

    rows = tour(args.out, only=[l.zfill(2) for l in args.lesson] or None, progress=not args.quiet)
    return 0 if all(r.as_declared for r in rows) else 1


def build_ops(args) -> int:
    from ..instruments.deepspeed_ops import main

    return main(timeout=args.timeout)
