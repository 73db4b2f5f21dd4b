"""The doctor's compile check (`compile=True` or `compile={...}`, `--compile`): the DDP training
steps once more, under `torch.compile` as the user compiles (their `fullgraph`, `dynamic`,
`backend` and `mode`), in one more launch. Each rank builds the module as the DDP phase did
(seeded apart, its own batch), wraps and compiles it, trains `steps` steps and reports what
`ddp_lab.instruments.compilewatch.CompileWatch` saw, and where module-level backward hooks were
registered (`BackwardHookSites`). The findings are the registry's check `compiled`
(doctor/checks/compiled.py, one check for the doctor and watch): an error where the user's
settings fail (fullgraph), graph breaks, recompiles with the same batch, ranks that compile
different graphs, each naming the user's line.

How it compiles: `torch.compile(DDP(model))`, or `DDP(torch.compile(model))` under fullgraph
(DDP's own forward breaks the graph, torch/nn/parallel/distributed.py:1757
`self.logger.set_runtime_stats_and_log()`, so fullgraph=True on the DDP wrapper fails for every
module). Inductor needs a C++ compiler (torch/_inductor/cpp_builder.py:372 get_cpp_compiler);
without one the graphs run on aot_eager and the report's note says so.
"""
from __future__ import annotations

from dataclasses import replace

from ...instruments.compilewatch import BackwardHookSites, CompileWatch
from ...launching.launcher import launch
from ...launching.rankinfo import device, rank_info
from ..batch import call, move
from ..checks import judge
from ..checks.api import Evidence
from ..errors import DoctorInputError
from ..frames import SLASHED_OWN as OWN  # as CompileWatch matches a frame's path
from ..sync import emit, records
from .dynamic import SEED, wrap
from .inputs import autocast
from .launch import ranges_of
from .randomness import seed_all
from .shapes import rank_batch

# seconds the compile launch gets at least: a first compile takes a rank about a second on an
# idle 2-core machine and over 20 s at load average 11; the DDP phase, which ran first, already
# caught a module that hangs
COMPILE_TIMEOUT = 120.0
KEYS = ("fullgraph", "dynamic", "backend", "mode")


def settings_of(compile) -> dict | None:
    """The user's torch.compile settings from doctor's `compile=` (False/None: no check; True:
    the doctor's default, aot_eager; a dict of fullgraph, dynamic, backend, mode as given to
    torch.compile, whose default backend is inductor), with `run`: the backend that will run."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return {"fullgraph": False, "dynamic": None, "backend": "aot_eager", "mode": None,
                "run": "aot_eager", "asked": False}
    if not isinstance(compile, dict):
        raise DoctorInputError(f"compile must be True or a dict of torch.compile settings "
                               f"({', '.join(KEYS)}), got {compile!r}")
    bad = sorted(set(compile) - set(KEYS))
    if bad:
        raise DoctorInputError(f"compile: unknown setting(s) {', '.join(bad)}; the doctor takes "
                               f"{', '.join(KEYS)}")
    out = {"fullgraph": bool(compile.get("fullgraph", False)), "dynamic": compile.get("dynamic"),
           "backend": compile.get("backend", "inductor"), "mode": compile.get("mode"), "asked": True}
    if out["dynamic"] not in (None, True, False):
        raise DoctorInputError(f"compile: dynamic must be None, True or False, got {out['dynamic']!r}")
    if not isinstance(out["backend"], str):
        raise DoctorInputError("compile: backend must be a backend's name (e.g. \"inductor\", "
                               f"\"aot_eager\"), got {out['backend']!r}")
    out["run"] = out["backend"] if out["backend"] != "inductor" or cpp_compiler() else "aot_eager"
    return out


def cpp_compiler() -> str:
    """The C++ compiler inductor would use on CPU, or "" when there is none."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # InvalidCxxCompiler (cpp_builder.py, cpp_compiler_search) and the like
        return ""


def note(settings: dict, steps: int) -> str:
    """The report's note: how the doctor compiled, and what it did not exercise."""
    given = ", ".join(f"{k}={settings[k]!r}" for k in KEYS if settings[k] not in (None, False))
    given = given if settings["asked"] else "the doctor's settings (compile=True)"
    how = ("DDP(torch.compile(model))" if settings["fullgraph"] else "torch.compile(DDP(model))")
    if settings["run"] != settings["backend"]:
        ran = (f"run on backend {settings['run']} instead of your {settings['backend']} (no C++ "
               "compiler on this machine: dynamo's graphs, guards and breaks are the same; "
               "inductor's kernels are not run)")
    elif settings["run"] == "aot_eager":
        ran = ("run on backend aot_eager (dynamo's graphs, guards and DDPOptimizer's splits, "
               "eager kernels)")
    else:
        ran = f"compiled by {settings['run']}"
    return (f"compile: the DDP steps again as {how} with {given or 'the defaults'}, {ran}. "
            f"Not exercised: each rank gets the same batch at each of the {steps} steps, so "
            "state your loop changes between steps (a length, a sampled width, an attribute "
            "set from outside) cannot show here: `ddp-lab watch` runs your own script for that")


def probe(subject) -> dict:
    """One rank: the module under DDP and torch.compile with the user's settings, `steps` steps
    on this rank's batch. Where backward hooks were registered is emitted before the first step,
    so it comes back even when compiling raises."""
    import torch

    source, example, steps, loss, amp = (subject.source, subject.example, subject.steps,
                                         subject.loss, subject.amp)
    settings, ddp_kwargs = subject.compile, subject.ddp_kwargs
    rank, dev = rank_info().rank, device()
    seed_all(SEED + rank)
    with BackwardHookSites(OWN) as sites:
        model = source.build().to(dev)
    emit("hook_sites", sites.sites)
    batch = move(rank_batch(example, rank, subject.plan), dev)
    torch.compiler.reset()
    with CompileWatch(own=OWN, compiler=settings["run"], mode=settings["mode"],
                      dynamic=settings["dynamic"]) as watch:
        options = dict(backend=watch.backend, fullgraph=settings["fullgraph"],
                       dynamic=settings["dynamic"])
        if settings["fullgraph"]:
            compiled = wrap(torch.compile(model, **options), dev, ddp_kwargs)
        else:
            compiled = torch.compile(wrap(model, dev, ddp_kwargs), **options)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        for _ in range(steps):
            with autocast(amp, dev.type):
                total = loss(call(compiled, batch), batch)
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            watch.step()
    return {"summary": watch.summary(), "graphs": watch.graphs, "lines": watch.lines}


def phase(subject):
    """(RunResult, findings of the registry's compiled check): the DDP steps again under
    torch.compile with `subject.compile`, DDP with `subject.ddp_kwargs` (run.py turns on
    find_unused_parameters where the DDP phase found parameters without gradient)."""
    subject = replace(subject, compile=subject.compile or settings_of(True),
                      timeout=max(subject.timeout, COMPILE_TIMEOUT))
    run = launch(probe, subject, world_size=subject.world_size, timeout=subject.timeout,
                 grace=2.0, label="doctor compile")
    ranks = [{**records(r.stdout), **(r.value if r.status == "ok" and isinstance(r.value, dict)
                                      else {})} for r in run.ranks]
    ev = Evidence(ranks, run, world_size=subject.world_size, subject=subject,
                  where=ranges_of(subject))
    return run, judge("compiled", ev)
