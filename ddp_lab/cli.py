"""The `ddp-lab` command (also `python -m ddp_lab`): list, run, tour, doctor, build-ops, check,
workshop, site."""
from __future__ import annotations

import argparse
import sys

from .rankinfo import in_torchrun, rank_info
from .registry import VARIANTS, get_lesson, lessons


def cmd_list(args) -> int:
    for lesson in lessons().values():
        print(f"{lesson.id}  {lesson.title}  (notebooks/{lesson.notebook}.ipynb)")
        for s in lesson.scenarios:
            print(f"      {s.name:<32} {s.title}")
    return 0


def cmd_run(args) -> int:
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
            problems = scenario.check(which, result)
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


def cmd_tour(args) -> int:
    from .tour import tour

    rows = tour(args.out, only=[l.zfill(2) for l in args.lesson] or None, progress=not args.quiet)
    return 0 if all(r.as_declared for r in rows) else 1


def cmd_build_ops(args) -> int:
    from .deepspeed_ops import main

    return main(timeout=args.timeout)


def cmd_check(args) -> int:
    from .check import run_checks

    return run_checks()


def cmd_workshop(args) -> int:
    from .workshop import build_workshop

    build_workshop(args.out, notebooks=args.notebooks, slides_assets=args.slides_assets)
    return 0


def cmd_site(args) -> int:
    from .site import build_site

    build_site(args.out, notebooks=args.notebooks)
    return 0


def _add_kit_parsers(sub) -> None:
    sub.add_parser("check", help="pre-flight check for a workshop: python, torch, two ranks, "
                   "JupyterLab").set_defaults(func=cmd_check)
    ws = sub.add_parser("workshop", help="the workshop kit: student and instructor notebooks, slides, guide")
    ws.add_argument("action", choices=["build"])
    ws.add_argument("out", help="output folder")
    ws.add_argument("--notebooks", default="notebooks", help="folder of executed lesson notebooks")
    ws.add_argument("--slides-assets", default=None, metavar="NODE_MODULES",
                    help="offline slides: an npm node_modules with reveal.js@4.0.2 and requirejs "
                         "(npm install --prefix DIR reveal.js@4.0.2 requirejs@2.3.7)")
    ws.set_defaults(func=cmd_workshop)
    site = sub.add_parser("site", help="a static HTML site of the executed notebooks")
    site.add_argument("action", choices=["build"])
    site.add_argument("out", help="output folder")
    site.add_argument("--notebooks", default="notebooks", help="folder of executed lesson notebooks")
    site.set_defaults(func=cmd_site)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-lab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="every lesson and scenario").set_defaults(func=cmd_list)
    run = sub.add_parser("run", help="run a lesson's scenarios on real ranks and check them")
    run.add_argument("lesson", help="lesson id, e.g. 00")
    run.add_argument("scenario", nargs="?", help="one scenario (default: all of the lesson)")
    run.add_argument("--variant", choices=VARIANTS, help="default: broken, then fixed")
    run.add_argument("--world-size", type=int, default=None)
    run.add_argument("--output", action="store_true", help="print every rank's stdout")
    run.set_defaults(func=cmd_run)
    tour = sub.add_parser("tour", help="every scenario broken then fixed; a table and the figures")
    tour.add_argument("--out", default="ddp-lab-tour", help="folder for the PNG figures")
    tour.add_argument("--lesson", action="append", default=[], help="only this lesson (repeatable)")
    tour.add_argument("--quiet", action="store_true", help="no progress bar")
    tour.set_defaults(func=cmd_tour)
    ops = sub.add_parser("build-ops", help="build DeepSpeed's C++ op once (lesson 12 needs it)")
    ops.add_argument("--timeout", type=float, default=1800.0, help="give up after this many s")
    ops.set_defaults(func=cmd_build_ops)
    _add_kit_parsers(sub)
    try:
        from .doctor.cli import add_parser
    except ImportError:
        pass
    else:
        add_parser(sub)
    return p


def main(argv=None) -> int:
    code = _main(argv)
    if argv is None and in_torchrun():  # the command line, as one of torchrun's ranks
        from .torchrun import end_rank

        end_rank(code)  # no interpreter teardown: it can abort a gloo rank (see torchrun.py)
    return code


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from .results import LaunchInterrupted

    try:
        return args.func(args)
    except (KeyError, ValueError) as exc:
        print(f"ddp-lab: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except LaunchInterrupted as stop:  # Ctrl-C during a launch: what the ranks did, one line
        print("\n".join(stop._render_traceback_()), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
