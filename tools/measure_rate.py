"""How often a scenario variant's declared outcome holds on this torch: the figure a
`Measured(...)` entry of a declaration carries (ddp_lab/course/registry.py).

    .upgrade/torch-2.14.1/bin/python tools/measure_rate.py 06/debug_detail broken --runs 50

Runs the variant RUNS times on real ranks, each checked against its declaration, and prints how
many held, with a tally of what the others did (status and root cause per rank). With
`--in-tour`, first does in this process what the tour does before that scenario (every lesson's
`prepare()`, then every earlier scenario, broken and fixed), so that the rate is counted where CI
meets the scenario: a declaration that holds alone may not hold there (issue 47: 06/debug_detail's
crash, in ranks forked from a fork server that had preloaded the earlier lessons' imports).
"""
from __future__ import annotations

import argparse
import collections
import sys


def outcome(result) -> str:
    """One line for a run: each rank's status (and signal or exception)."""
    return ", ".join(f"rank {r.rank} {r.status}" + (f" ({r.headline[:40]})" if not r.ok else "")
                     for r in result.ranks)


def tour_before(scenario) -> int:
    """Do what the tour does before `scenario`; how many scenarios ran."""
    from ddp_lab.course.registry import lessons
    from ddp_lab.course.tour import run_scenario

    chosen = list(lessons().values())
    for lesson in chosen:  # as tour() does: every prepare first (op builds, fork-server preloads)
        if lesson.prepare is not None:
            lesson.prepare()
    ran = 0
    for lesson in chosen:
        for earlier in lesson.scenarios:
            if earlier.key == scenario.key:
                return ran
            run_scenario(earlier)
            ran += 1
    return ran


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="LESSON/NAME, e.g. 06/debug_detail")
    parser.add_argument("variant", choices=("broken", "fixed"))
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--in-tour", action="store_true",
                        help="first run what the tour runs before this scenario, in this process")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
    lesson_id, _, name = args.scenario.partition("/")
    import torch

    from ddp_lab.course.registry import get_scenario

    try:
        scenario = get_scenario(lesson_id, name)
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    if args.in_tour:
        print(f"after the tour's {tour_before(scenario)} earlier scenarios", file=sys.stderr)
    held, others = 0, collections.Counter()
    for i in range(args.runs):
        result = scenario.run(args.variant)
        if scenario.differences(args.variant, result):
            others[outcome(result)] += 1
        else:
            held += 1
        print(f"\r{i + 1}/{args.runs} runs, {held} as declared", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{scenario.key} {args.variant}: as declared in {held} of {args.runs} runs on torch "
          f"{torch.__version__}" + (" (after the tour's earlier scenarios)" if args.in_tour else ""))
    for line, count in others.most_common():
        print(f"  {count} x {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
