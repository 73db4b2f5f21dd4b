"""The compile check, one for both tools (lesson 15): torch.compile as the user compiles, and what
fails, breaks, recompiles or differs between ranks, each at the user's line.

- In a watched run (`ddp-lab watch`), torch.compile in the user's own loop, with the script's
  settings: each rank records, from outside (_compiled_rank.py), every frame dynamo compiles
  (torch._dynamo.utils.get_compilation_metrics(), one CompilationMetrics per frame compile: the
  function, its op count, `recompile_reason` = the first guard that failed,
  `fail_type`/`fail_reason`, the stack that called it; torch/_dynamo/convert_frame.py:1951-1974
  and 2180-2250), stamped with the step it happened in, and every graph break as dynamo logs it
  to its `graph_breaks` artifact logger (torch/_dynamo/symbolic_convert.py:5026-5136); judged by
  _compiled_judge.py.
- For the doctor (`compile=True` or `compile={...}`, `--compile`): the module's DDP steps once
  more under torch.compile with the user's fullgraph, dynamic, backend and mode
  (exam/compile_run.py), read by instruments/compilewatch.py; judged by _compiled_module.py.

The codes, the same for both:
- `fullgraph-failed` (error): fullgraph=True raises where the user's run would, with PyTorch's
  reason and the line that causes it: for a module-level backward hook the line that
  REGISTERED it (torch/_dynamo/variables/distributed.py:174), not forward's call of the module;
  for DDP's own break (torch/nn/parallel/distributed.py) the line that compiled the DDP model
  with fullgraph=True.
- `fails-under-compile` (error, the doctor): any other failure under compile only (an
  exception, a crash or a hang of the compile launch after the DDP phase ran through).
- `graph-break` (info or warning): breaks whose place is the user's code (DDP's own breaks are
  not); a warning when the module breaks (the doctor), or in watch when the break recurs every
  step: the same break traced again in two or more steps after the first, or a break on the
  path of every call of a compiled forward (no `if`/`else`/`except`/`match` of the user's between
  the compiled frame and it: _compiled_paths.py) whose compiled callable ran in every step
  after the one that traced it, two at least (compiled once, then run each step: the graph
  before it, Python for the line, the graph after it). A break under a Python branch (a logging
  path), or in compiled code run on some steps only (evaluation, a warm-up), stays a note.
- `recompiles-every-step` / `recompiles-after-first-step` (warning): the same guard fails step
  after step with a new value: state that changes between steps is a constant of the graph (an
  int attribute of a module, torch/_dynamo/config.py:402 allow_unspec_int_on_nn_module=False; a
  Python float that cannot become a tensor input); the doctor feeds the same batch every step,
  so the Python state forward reads is the cause. `where`: the user's line that changes it (an
  assignment outside __init__), or the call passing it in; when the compiled function itself
  writes the attribute its guard reads (forward increments a counter), the line of that
  function that reads it into the graph (the writer is in the evidence).
- `ranks-compile-differently`: ranks compile different frames or graphs. DDP's all-reduces stay
  in its reducer (Note [DDPOptimizer], torch/_dynamo/backends/distributed.py:390-420), so the
  sums stay right; but the rank that compiles alone holds every other rank in the next
  all-reduce for the whole compile, and with compiler or guard collectives it hangs. An error
  when the run then failed or hung, a warning otherwise, a note when only input shapes differ,
  or when every graph only some ranks compile was traced under no_grad (an evaluation one rank
  runs alone) in a step in which every other rank compiled too (the warm-up: nanoGPT evaluates
  on rank 0 at iteration 0). Graphs are compared by frame, size and grad mode, not by the guard
  that failed (that names what the rank had compiled before).
"""
from __future__ import annotations

from . import _compiled_judge, _compiled_module
from ._compiled_rank import attach
from .api import Check, Evidence, Finding


def judge(ev: Evidence) -> list[Finding]:
    """The doctor's compile launch (`ev.subject` set), or a watched run."""
    if ev.subject is not None:
        return _compiled_module.judge(ev)
    return _compiled_judge.judge(ev)


CHECK = Check(
    name="compiled",
    mechanism="torch.compile as the user compiles (the script's own loop; the module's DDP "
              "steps with the user's settings): fullgraph failures, graph breaks, recompiles "
              "every step, ranks compiling differently, each at the user's line",
    lesson="15",
    codes={"fullgraph-failed": "error", "fails-under-compile": "error", "graph-break": "warning",
           "recompiles-every-step": "warning", "recompiles-after-first-step": "warning",
           "ranks-compile-differently": "error"},
    attach=attach, judge=judge, tools=("watch", "doctor"),
    tests=("tests/doctor/checks/test_compiled.py", "tests/doctor/checks/test_compiled_doctor.py"),
    notes=("compiles are read from torch._dynamo.utils.get_compilation_metrics(), which keeps "
           "the last 64: a step that compiles more loses the oldest",
           "graph breaks outside the user's files (DDP's own, a library's) are not reported",
           "the doctor feeds one batch shape per rank every step: state the user's loop changes "
           "between steps is watch's (script mode)",
           "an evaluation under no_grad one rank compiles alone is a note in a step where every "
           "rank compiles (the warm-up), a warning later, while the others wait for it",
           "a graph break is a warning when it recurs every step: retraced, or on every call's "
           "path of a compiled forward (no branch of the user's above it) run each step"))
