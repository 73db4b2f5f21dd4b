"""The doctor's subcommand of `ddp-lab`: `ddp-lab doctor path/to/file.py:Name --input
"torch.randn(8, 16)"` (also `python -m ddp_lab.doctor ...`). Exit status: 0 no error-level finding, 1 some, 2 bad input,
3 the doctor itself failed."""
from __future__ import annotations

import argparse
import sys

from . import doctor
from .errors import DoctorBug, DoctorInputError
from .exam.tp_plan import eval_plan
from .loader import eval_input, eval_loss, load_target, parse_ddp

HELP = "diagnose your own module: static checks, then real ranks under DDP"
EPILOG = """examples:
  ddp-lab doctor mymodel.py:Net --input "torch.randn(8, 16)"
  ddp-lab doctor mymodel.py:make_model --input "(torch.randn(4, 10, 32), torch.ones(4, 10))"
  ddp-lab doctor mymodel.py:Net --input make_batch --amp bf16 --json
  ddp-lab doctor bert.py:Encoder --input "torch.randn(4, 12, 32)" \\
      --loss "lambda out, batch: out[0].pow(2).mean()" --ddp find_unused_parameters=True

--input is a Python expression evaluated with torch, nn, math, F and the file's own names: a
tensor, a tuple (forward's positional arguments), a dict (its keyword arguments), or a
function rank -> batch. --loss is such an expression too: a function (output) or
(output, batch) -> loss, your training loss (default: every floating-point output, weighted).
--ddp gives your DistributedDataParallel settings, comma-separated NAME=VALUE (Python values).
Exit status: 0 no error found, 1 errors found, 2 bad input, 3 the doctor itself failed."""


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("target", help="path/to/file.py:Name (an nn.Module class, a zero-argument "
                                  "factory, or an instance)")
    p.add_argument("--input", dest="input_expr", required=True, metavar="EXPR",
                   help='example input, e.g. "torch.randn(8, 16)"')
    p.add_argument("--loss", dest="loss_expr", metavar="EXPR",
                   help='your loss, e.g. "lambda out, batch: out[0].mean()"')
    p.add_argument("--ddp", dest="ddp_expr", metavar="NAME=VALUE,...",
                   help="your DDP settings, e.g. find_unused_parameters=True,static_graph=False")
    p.add_argument("--world-size", type=int, default=2, help="ranks to run (default 2)")
    p.add_argument("--steps", type=int, default=3, help="DDP training steps (default 3)")
    p.add_argument("--amp", choices=("bf16", "fp16"), help="run forward under torch.autocast")
    p.add_argument("--strategy", choices=("ddp", "fsdp2", "zero3", "tp"), default="ddp",
                   help="also check the module sharded by FSDP2 or DeepSpeed ZeRO-3, or split "
                        "by tensor parallelism (tp)")
    p.add_argument("--tp-plan", dest="tp_plan_expr", metavar="EXPR",
                   help="with --strategy tp: your plan, e.g. "
                        "\"{'up': 'colwise', 'down': 'rowwise'}\"")
    p.add_argument("--parallelize", dest="parallelize_spec", metavar="PATH:FN",
                   help="with --strategy tp: your own split, a function (model, mesh) in a file, "
                        "e.g. train.py:parallelize (parallelize_module and whatever you do after "
                        "it); FN alone names one in the module's file")
    p.add_argument("--compile", action="store_true",
                   help="also train under torch.compile: graph breaks, recompiles, ranks whose "
                        "graphs differ")
    p.add_argument("--compile-fullgraph", action="store_true",
                   help="compile as you do with fullgraph=True (implies --compile)")
    p.add_argument("--compile-dynamic", choices=("true", "false"),
                   help="your torch.compile dynamic= (implies --compile)")
    p.add_argument("--compile-backend", metavar="NAME",
                   help="your torch.compile backend, e.g. inductor or aot_eager (implies "
                        "--compile; inductor falls back to aot_eager without a C++ compiler)")
    p.add_argument("--compile-mode", metavar="MODE",
                   help="your torch.compile mode, e.g. max-autotune (inductor; implies --compile)")
    p.add_argument("--timeout", type=float, default=60, help="seconds before a hang is reported")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.add_argument("--traces", action="store_true", help="full tracebacks and stacks in the text")
    p.set_defaults(func=run)
    return p


def add_commands(sub) -> None:
    """The doctor's subcommand of `ddp-lab` (as every part adds its own: see ddp_lab/cli.py)."""
    configure(sub.add_parser("doctor", help=HELP, description=HELP, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter))


def run(args) -> int:
    """Load, diagnose, print; the exit status."""
    try:
        model, module = load_target(args.target)
        example = eval_input(args.input_expr, vars(module))
        loss_fn = eval_loss(args.loss_expr, vars(module)) if args.loss_expr else None
        settings = parse_ddp(args.ddp_expr) if args.ddp_expr else None
        tp_plan = _tp_plan(args, module)
        report = doctor(model, example, world_size=args.world_size, steps=args.steps,
                        amp=args.amp, timeout=args.timeout, loss_fn=loss_fn,
                        ddp_kwargs=settings, strategy=args.strategy, compile=_compile(args),
                        tp_plan=tp_plan, parallelize=_parallelize(args, module))
    except DoctorInputError as exc:
        print(f"ddp-lab doctor: {exc}", file=sys.stderr)
        return 2
    except DoctorBug as exc:
        print(f"ddp-lab doctor: {exc}", file=sys.stderr)
        return 3
    print(report.to_json() if args.json else report.text(traces=args.traces))
    return report.exit_status


def _compile(args):
    """--compile alone: True (the doctor's aot_eager); any --compile-* flag: your settings, with
    torch.compile's own defaults for the rest."""
    given = {"fullgraph": getattr(args, "compile_fullgraph", False) or None,
             "dynamic": {"true": True, "false": False}.get(getattr(args, "compile_dynamic", None)),
             "backend": getattr(args, "compile_backend", None),
             "mode": getattr(args, "compile_mode", None)}
    given = {k: v for k, v in given.items() if v is not None}
    return given or bool(args.compile)


def _parallelize(args, module):
    """--parallelize path/to/file.py:fn, or fn in the module's own file."""
    spec = getattr(args, "parallelize_spec", None)
    if not spec:
        return None
    fn = load_target(spec)[0] if ":" in spec else getattr(module, spec, None)
    if not callable(fn):
        raise DoctorInputError(f"--parallelize {spec}: not a function (model, mesh)")
    return fn


def _tp_plan(args, module):
    if not getattr(args, "tp_plan_expr", None):
        return None

    return eval_plan(args.tp_plan_expr, vars(module))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__package__}", description=HELP, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    return run(configure(p).parse_args(argv))
