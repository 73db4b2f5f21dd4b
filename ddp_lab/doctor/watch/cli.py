"""`ddp-lab watch path/to/train.py:train_step --model path:Factory --batches path:batches
--strategy ddp|fsdp2|zero3`: your own training step on real ranks, checked after each step.
Exit status: 0 no error-level finding, 1 some, 2 bad input."""
from __future__ import annotations

import argparse
import sys

HELP = "watch your own training step on real ranks: state, randomness, collectives, reads, saves, logged values"
EPILOG = """examples:
  ddp-lab watch examples/watch_train.py:train_step --model examples/watch_train.py:Net \\
      --batches examples/watch_train.py:batches --save examples/watch_train.py:save
  ddp-lab watch train.py:train_step --model train.py:make_model --batches train.py:batches --strategy zero3

train_step(model, batch, step[, optimizer]) returns what you log (a float, a 0-dim tensor, or a
dict of them); --model is a zero-argument factory (or an nn.Module class); --batches a function
(rank, step) -> batch; --save a function (model, path); --evaluate a function (model, batch)
returning what you log. A NAME without a path is looked up in
the step's file. Exit status: 0 no error found, 1 errors found, 2 bad input."""


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("target", help="path/to/train.py:train_step")
    p.add_argument("--model", required=True, metavar="PATH:NAME", help="the model factory")
    p.add_argument("--batches", default="batches", metavar="PATH:NAME",
                   help="a function (rank, step) -> batch (default: batches in the step's file)")
    p.add_argument("--save", metavar="PATH:NAME", help="your checkpoint code, (model, path)")
    p.add_argument("--evaluate", metavar="PATH:NAME", help="your evaluation, (model, batch)")
    p.add_argument("--strategy", choices=("ddp", "fsdp2", "zero3"), default="ddp")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to run (default 2)")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a hang is reported")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--cost", action="store_true", help="also print seconds per step")
    p.set_defaults(func=run)
    return p


def add_commands(sub) -> None:
    """watch's subcommand of `ddp-lab` (as every part adds its own: see ddp_lab/cli.py)."""
    configure(sub.add_parser("watch", help=HELP, description=HELP, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter))


def _named(spec: str, module):
    """`path:NAME` loaded, or NAME from the step's own file."""
    from ..loader import load_target

    if ":" in spec:
        return load_target(spec)[0]
    if not hasattr(module, spec):
        from . import WatchInputError
        raise WatchInputError(f"{module.__file__} has no {spec!r}: give it as path/to/file.py:{spec}")
    return getattr(module, spec)


def run(args) -> int:
    from ..inputs import DoctorInputError
    from ..loader import load_target
    from . import WatchInputError, watch

    try:
        step, module = load_target(args.target)
        report = watch(step, _named(args.model, module), _named(args.batches, module),
                       save=_named(args.save, module) if args.save else None,
                       evaluate=_named(args.evaluate, module) if args.evaluate else None,
                       strategy=args.strategy, steps=args.steps, world_size=args.world_size,
                       timeout=args.timeout)
    except (WatchInputError, DoctorInputError) as exc:
        print(f"ddp-lab watch: {exc}", file=sys.stderr)
        return 2
    print(report.to_json() if args.json else report.text())
    if args.cost and report.seconds_per_step:
        cost = report.seconds_per_step
        print(f"cost: {cost['step'] * 1e3:.1f} ms per step with watch's instruments, of which "
              f"{cost['checks'] * 1e3:.2f} ms its checks after the step")
    return report.exit_status
