"""The course's subcommands of `ddp-lab`: list, run, tour, build-ops."""
from __future__ import annotations

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
    lesson = get_lesson(args.lesson)
    scenarios = [lesson.scenario(args.scenario)] if args.scenario else lesson.scenarios
    variants = [args.variant] if args.variant else list(VARIANTS)
    failed = 0
    for scenario in scenarios:
        for which in variants:
            result = scenario.run(which, world_size=args.world_size)
            if in_torchrun():  # this process is one rank of torchrun's group: report it alone
                r, info = result.ranks[0], rank_info()
                local = f" (local rank {info.local_rank})" if info.local_rank != info.rank else ""
                print(f"[rank {info.rank}] {scenario.key} {which}: {r.status} {r.headline}{local}")
                failed += r.status != scenario.variant(which).expect.status
                continue
            problems = scenario.differences(which, result)
            print(repr(result))
            print(f"  declared: {scenario.variant(which).expect.describe()}  ->  "
                  + ("as declared" if not problems else "NOT as declared"))
            for p in problems:
                print(f"  - {p}")
            if any(r.steps for r in result.ranks):  # the ranks marked steps: what they cost
                print(result.costs())
            if args.output:
                result.print_output()
            failed += bool(problems)
    return 1 if failed else 0


def run_tour(args) -> int:
    from .tour import tour

    rows = tour(args.out, only=[l.zfill(2) for l in args.lesson] or None, progress=not args.quiet)
    return 0 if all(r.as_declared for r in rows) else 1


def build_ops(args) -> int:
    from ..instruments.deepspeed_ops import main

    return main(timeout=args.timeout)
