"""`ddp-lab watch [options] train.py [script args]`: your training script, unchanged, on real
ranks (as `torchrun --nproc-per-node N train.py args` runs it) with every watch check attached
(ddp_lab/doctor/checks). `ddp-lab watch path/to/train.py:train_step --model path:Factory
--batches path:batches --strategy ddp|fsdp2|zero3`: your own training step, the function API's way.
Exit status: 0 no error-level finding, 1 some, 2 bad input, or the script's own non-zero status."""
from __future__ import annotations

import argparse
import sys

from ..errors import DoctorBug, DoctorInputError
from ..loader import load_target
from . import watch, WatchInputError
from .script import exit_status, watch_script, WatchScriptError

HELP = "run your training script unchanged on real ranks, checked from outside: state, samples, collectives, checkpoints, logged values, compile"
_MODULE = f"{__package__.partition('.')[0]}.watch"  # python -m ... under torchrun
EPILOG = f"""examples:
  ddp-lab watch train.py                     # 2 ranks, as torchrun --nproc-per-node 2 train.py
  ddp-lab watch --nproc-per-node 4 --timeout 30 train.py --epochs 1 --lr 0.1
  ddp-lab watch --reference train.py         # also against one process on the same global batch
  torchrun --nnodes 2 --nproc-per-node 8 ... -m {_MODULE} train.py   # inside your own job

The function API (a training step cut out of the script):
  ddp-lab watch examples/watch_train.py:train_step --model examples/watch_train.py:Net \\
      --batches examples/watch_train.py:batches --save examples/watch_train.py:save
  ddp-lab watch train.py:train_step --model train.py:make_model --batches train.py:batches --strategy zero3

train_step(model, batch, step[, optimizer]) returns what you log (a float, a 0-dim tensor, or a
dict of them); --model is a zero-argument factory (or an nn.Module class); --batches a function
(rank, step) -> batch; --save a function (model, path); --evaluate a function (model, batch)
returning what you log. A NAME without a path is looked up in
the step's file. Exit status: 0 no error found, 1 errors found, 2 bad input."""


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("target", help="train.py (your script, run unchanged) or path/to/train.py:train_step")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.add_argument("--nproc-per-node", type=int, default=None, metavar="N",
                   help="ranks to run the script on (default 2)")
    p.add_argument("--model", metavar="PATH:NAME", help="the model factory (function API)")
    p.add_argument("--batches", default="batches", metavar="PATH:NAME",
                   help="a function (rank, step) -> batch (default: batches in the step's file)")
    p.add_argument("--save", metavar="PATH:NAME", help="your checkpoint code, (model, path)")
    p.add_argument("--evaluate", metavar="PATH:NAME", help="your evaluation, (model, batch)")
    p.add_argument("--strategy", choices=("ddp", "fsdp2", "zero3"), default="ddp")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--world-size", type=int, default=2, help="ranks to run (default 2)")
    p.add_argument("--timeout", type=float, default=60,
                   help="seconds the ranks may run (script mode: from the start) before a hang is reported")
    p.add_argument("--reference", action="store_true",
                   help="script mode: also run the script at world size 1 on the same global batch "
                        "and report the first step and tensor where the runs part (one more launch)")
    p.add_argument("--reference-steps", type=int, default=None, metavar="K",
                   help="optimizer steps the reference compares (default 3; implies --reference)")
    p.add_argument("--global-batch", type=int, default=None, metavar="G",
                   help="with --reference: the samples per optimizer step the job means (a step "
                        "on the ranks that trains on another number is a warning)")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--cost", action="store_true", help="also print seconds per step")
    p.set_defaults(func=run, parser=p)
    return p


def add_commands(sub) -> None:
    """watch's subcommand of `ddp-lab` (as every part adds its own: see ddp_lab/cli.py)."""
    configure(sub.add_parser("watch", help=HELP, description=HELP, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter))


def _named(spec: str, module):
    """`path:NAME` loaded, or NAME from the step's own file."""
    if ":" in spec:
        return load_target(spec)[0]
    if not hasattr(module, spec):
        raise WatchInputError(f"{module.__file__} has no {spec!r}: give it as path/to/file.py:{spec}")
    return getattr(module, spec)


def _is_script(target: str) -> bool:
    path, sep, name = target.rpartition(":")
    return not (sep and path.endswith(".py") and name.isidentifier())


def run_script(args) -> int:
    nproc = args.nproc_per_node if args.nproc_per_node is not None else args.world_size
    try:
        reference = args.reference_steps if args.reference_steps is not None else (args.reference or None)
        report = watch_script(args.target, args.script_args, nproc=nproc, timeout=args.timeout,
                              progress=sys.stderr, reference=reference,
                              global_batch=args.global_batch)
    except WatchScriptError as exc:
        if exc.output:
            print(exc.output, file=sys.stderr)
        print(f"ddp-lab watch: {exc}", file=sys.stderr)
        return 2
    except DoctorBug as exc:
        print(f"ddp-lab watch: {exc}", file=sys.stderr)
        return 3
    print(report.to_json() if args.json else report.text())
    return exit_status(report)


def run(args) -> int:
    if _is_script(args.target):
        return run_script(args)
    if args.script_args:  # the function API's options, given after its step: parse them too
        args = args.parser.parse_args([*args.script_args, args.target], namespace=args)
        if args.script_args:
            print(f"ddp-lab watch: unexpected arguments {' '.join(args.script_args)} after "
                  f"{args.target} (a script's arguments follow a script, train.py)", file=sys.stderr)
            return 2
    if args.reference or args.reference_steps is not None or args.global_batch is not None:
        print("ddp-lab watch: --reference, --reference-steps and --global-batch serve a script "
              "(ddp-lab watch --reference train.py), not a step function", file=sys.stderr)
        return 2
    if not args.model:
        print("ddp-lab watch: a step function (path:NAME) needs --model path:Factory; to watch a "
              "whole script, give its path alone (train.py)", file=sys.stderr)
        return 2

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
