"""Whether a scenario variant shows the same output every time under load: run it RUNS times with
BUSY busy loops beside it and count the distinct outputs, as strict nbval compares them (the HTML
and the text a notebook cell shows, through notebooks/sanitize.cfg).

    .venv/bin/python benchmarks/output_steady.py 00/collective_on_one_rank broken --runs 20 --busy 2

Prints a dot per run, then the number of distinct outputs and, for each one after the first, a
diff against the first. Exit status 1 when they differ.
"""
from __future__ import annotations

import argparse
import collections
import configparser
import difflib
import re
import subprocess
import sys
from pathlib import Path

SANITIZE = Path(__file__).resolve().parent.parent / "notebooks" / "sanitize.cfg"


def sanitizer():
    cfg = configparser.ConfigParser()
    cfg.read(SANITIZE)
    rules = [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]

    def sanitize(text: str) -> str:
        for rx, replacement in rules:
            text = rx.sub(replacement, text)
        return text
    return sanitize


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="LESSON/NAME, e.g. 00/collective_on_one_rank")
    parser.add_argument("variant", choices=("broken", "fixed"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the runs")
    args = parser.parse_args(argv)
    from ddp_lab.course.registry import get_scenario

    lesson_id, _, name = args.scenario.partition("/")
    scenario = get_scenario(lesson_id, name)
    sanitize = sanitizer()
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(args.busy)]
    seen: collections.Counter = collections.Counter()
    try:
        for _ in range(args.runs):
            result = scenario.run(args.variant)
            seen[sanitize(result._repr_html_()) + "\n" + sanitize(repr(result))] += 1
            print(".", end="", flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    outputs = list(seen)
    print(f"\n{scenario.key} {args.variant}: {len(outputs)} distinct output(s) in {args.runs} runs "
          f"with {args.busy} busy loops ({', '.join(str(seen[o]) for o in outputs)})")
    for other in outputs[1:]:
        print("\n".join(list(difflib.unified_diff(outputs[0].splitlines(), other.splitlines(),
                                                  lineterm=""))[:40]))
    return 0 if len(outputs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
