"""The `ddp-lab` command (also `python -m ddp_lab`). One parser; each part of the package adds
its own subcommands to it the same way, with its `cli.add_commands(subparsers)`: the course
(list, run, tour, build-ops), the kit (check, workshop, site), the doctor (doctor) and watch (watch)."""
from __future__ import annotations

import argparse
import sys

from .course import cli as course
from .doctor import cli as doctor
from .doctor.watch import command as watch
from .kit import cli as kit
from .launching.rankinfo import in_torchrun

DESCRIPTION = ("Reproduce the errors of custom nn.Modules in PyTorch distributed training on real "
               "ranks: list, run and tour the course's scenarios, build DeepSpeed's op, check a "
               "machine before a workshop, build the workshop kit and the course's site, and "
               "diagnose your own module (doctor) and your own training step (watch).")
PARTS = (course, kit, doctor, watch)  # in the order of `ddp-lab --help`


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddp-lab", description=DESCRIPTION)
    sub = p.add_subparsers(dest="command", required=True)
    for part in PARTS:
        part.add_commands(sub)
    return p


def main(argv=None) -> int:
    code = _main(argv)
    if argv is None and in_torchrun():  # the command line, as one of torchrun's ranks
        from .launching.torchrun import end_rank

        end_rank(code)  # no interpreter teardown: it can abort a gloo rank (see torchrun.py)
    return code


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    from .instruments.deepspeed_ops import OpBuildError
    from .launching.results import LaunchInterrupted

    try:
        return args.func(args)
    except (KeyError, ValueError) as exc:
        print(f"ddp-lab: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except LaunchInterrupted as stop:  # Ctrl-C during a launch: what the ranks did, one line
        print("\n".join(stop._render_traceback_()), file=sys.stderr)
        return 130
    except OpBuildError as exc:  # this environment cannot run it yet: the command that fixes it
        print(f"ddp-lab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
