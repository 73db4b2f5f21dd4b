"""`ddp-lab watch [options] train.py [script args]`: your training script, unchanged, on real
ranks (as `torchrun --nproc-per-node N train.py args` runs it) with every watch check attached
(ddp_lab/doctor/checks). `ddp-lab watch path/to/train.py:train_step --model path:Factory
--batches path:batches --strategy ddp|fsdp2|zero3`: your own training step, the function API's way.
The script's output is shown as it runs (each line prefixed with its rank, as `torchrun --tee 3`
does), then the report. Exit status: 0 no error-level finding, 1 some, 2 bad input, 3 watch's
own failure, or the script's own non-zero status."""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from ..errors import DoctorBug, DoctorInputError
from ..loader import load_target
from . import watch, WatchInputError
from .console import Console, parse_ranks
from .script import error_dict, exit_status, report_dict, watch_script, WatchScriptError

HELP = "run your training script unchanged on real ranks, checked from outside: state, samples, collectives, checkpoints, logged values, compile"
_MODULE = f"{__package__.partition('.')[0]}.watch"  # python -m ... under torchrun
EPILOG = f"""examples:
  ddp-lab watch train.py                     # 2 ranks, as torchrun --nproc-per-node 2 train.py
  ddp-lab watch --nproc-per-node 4 --timeout 30 train.py --epochs 1 --lr 0.1
  ddp-lab watch --local-ranks-filter 0 --json train.py   # rank 0's output on stderr, JSON on stdout
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
                   help="a script: seconds one step may take before the ranks are reported hung "
                        "(a step ends when an optimizer's step() returns); a step function: "
                        "seconds the ranks may run (default 60)")
    p.add_argument("--first-step-timeout", type=float, default=None, metavar="S",
                   help="a script: seconds its first step may take, from its start (imports, "
                        "data loading, compile); default the larger of 120 and 4 x --timeout")
    p.add_argument("--local-ranks-filter", default=None, metavar="RANKS",
                   help="a script: show only these ranks' output, e.g. 0 (as torchrun's option)")
    p.add_argument("--reference", action="store_true",
                   help="script mode: also run the script at world size 1 on the same global batch "
                        "and report the first step and tensor where the runs part (one more launch)")
    p.add_argument("--reference-steps", type=int, default=None, metavar="K",
                   help="optimizer steps the reference compares (default 3; implies --reference)")
    p.add_argument("--global-batch", type=int, default=None, metavar="G",
                   help="with --reference: the samples per optimizer step the job means (a step "
                        "on the ranks that trains on another number is a warning)")
    p.add_argument("--json", action="store_true",
                   help="the report as JSON on stdout (a script's own output goes to stderr)")
    p.add_argument("--cost", action="store_true",
                   help="also print seconds per step (a script: each rank's steps and the time "
                        "watch's checks took after each)")
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


def _no_report(args, exc: Exception, status: int) -> int:
    """A run that gave no report: the message on stderr (after the script's own traceback), and
    with --json the same as JSON on stdout."""
    if args.json:
        print(json.dumps(error_dict(exc, status), indent=2))
    if getattr(exc, "output", ""):
        print(exc.output, file=sys.stderr)
    print(f"ddp-lab watch: {exc}", file=sys.stderr)
    return status


def run_script(args) -> int:
    nproc = args.nproc_per_node if args.nproc_per_node is not None else args.world_size
    try:
        ranks = parse_ranks(args.local_ranks_filter, max(nproc, 1))
    except ValueError as exc:
        return _no_report(args, WatchScriptError(str(exc)), 2)
    reference = args.reference_steps if args.reference_steps is not None else (args.reference or None)
    console = Console(sys.stdout, sys.stderr, ranks, json=args.json)
    try:
        report = watch_script(args.target, args.script_args, nproc=nproc, timeout=args.timeout,
                              first_step_timeout=args.first_step_timeout, progress=console,
                              output=console.line, reference=reference,
                              global_batch=args.global_batch)
    except WatchScriptError as exc:
        return _no_report(args, exc, 2)
    except DoctorBug as exc:
        return _no_report(args, exc, 3)
    data = report_dict(report)
    if args.cost:
        data["cost"] = script_cost(report)
    print(json.dumps(data, indent=2) if args.json else report.text())
    if args.cost and not args.json:
        print(cost_text(data["cost"]))
    return exit_status(report)


def script_cost(report) -> list[dict]:
    """Per rank: its first step (from the process group's start), its other steps' median and
    slowest, and what watch's checks took after each step (steps.py's "step-hooks")."""
    out = []
    for r, rec in enumerate(report.evidence.ranks):
        ended = [s for s in rec.get("steps", []) if s.get("begin") and s.get("end")]
        rest = [s["end"] - s["begin"] for s in ended[1:]]
        hooks = rec.get("step-hooks") or {}
        out.append({"rank": r, "steps": len(ended),
                    "first_step_s": round(ended[0]["end"] - ended[0]["begin"], 4) if ended else None,
                    "step_median_s": round(statistics.median(rest), 6) if rest else None,
                    "step_max_s": round(max(rest), 6) if rest else None,
                    "checks_per_step_s": round(hooks["seconds"] / hooks["steps"], 6)
                    if hooks.get("steps") else None,
                    "checks_max_s": hooks.get("max")})
    return out


def cost_text(cost: list[dict]) -> str:
    lines = ["cost (each rank's steps, as watched; watch's share beyond its checks' after-step "
             "hooks: benchmarks/watch_script_cost.py):"]
    for c in cost:
        if not c["steps"]:
            lines.append(f"  rank {c['rank']}: no optimizer step ended")
            continue
        text = f"  rank {c['rank']}: first step {c['first_step_s']:.2f} s"
        if c["step_median_s"] is not None:
            text += (f"; {c['steps'] - 1} more, median {c['step_median_s'] * 1e3:.1f} ms, "
                     f"slowest {c['step_max_s'] * 1e3:.1f} ms")
        if c["checks_per_step_s"] is not None:
            text += (f"; watch's checks after each step {c['checks_per_step_s'] * 1e3:.2f} ms "
                     f"(slowest {c['checks_max_s'] * 1e3:.2f} ms)")
        lines.append(text)
    return "\n".join(lines)


def run(args) -> int:
    if _is_script(args.target):
        return run_script(args)
    if args.script_args:  # the function API's options, given after its step: parse them too
        args = args.parser.parse_args([*args.script_args, args.target], namespace=args)
        if args.script_args:
            return _no_report(args, WatchInputError(
                f"unexpected arguments {' '.join(args.script_args)} after {args.target} (a "
                "script's arguments follow a script, train.py)"), 2)
    if args.reference or args.reference_steps is not None or args.global_batch is not None:
        return _no_report(args, WatchInputError(
            "--reference, --reference-steps and --global-batch serve a script (ddp-lab watch "
            "--reference train.py), not a step function"), 2)
    if not args.model:
        return _no_report(args, WatchInputError(
            "a step function (path:NAME) needs --model path:Factory; to watch a whole script, "
            "give its path alone (train.py)"), 2)

    try:
        step, module = load_target(args.target)
        report = watch(step, _named(args.model, module), _named(args.batches, module),
                       save=_named(args.save, module) if args.save else None,
                       evaluate=_named(args.evaluate, module) if args.evaluate else None,
                       strategy=args.strategy, steps=args.steps, world_size=args.world_size,
                       timeout=args.timeout)
    except (WatchInputError, DoctorInputError) as exc:
        return _no_report(args, exc, 2)
    print(report.to_json() if args.json else report.text())
    if args.cost and report.seconds_per_step:
        cost = report.seconds_per_step
        print(f"cost: {cost['step'] * 1e3:.1f} ms per step with watch's instruments, of which "
              f"{cost['checks'] * 1e3:.2f} ms its checks after the step")
    return report.exit_status
