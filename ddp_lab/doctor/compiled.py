"""The doctor's compile check (`compile=True`, `--compile`): the DDP training steps once more,
under `torch.compile` (backend aot_eager), in one more launch. Each rank builds the module as the
DDP phase did (seeded apart, its own batch), wraps it in DDP, compiles it, trains `steps` steps
and reports what `ddp_lab.instruments.compilewatch.CompileWatch` saw. The findings (lesson 15):

- graph breaks whose cause lies in the module's own code (DDP's own breaks are not the user's);
- recompiles after the first step: the same batch every step, so a recompile means forward
  reads Python state that changes (PyTorch's guard names it);
- ranks whose compiled graphs differ (ops, not shapes: the ranks' batches differ in length on
  purpose), or that recompile a different number of times;
- an exception raised under compile only (the DDP phase ran).
Each names the line of the user's module that causes it.
"""
from __future__ import annotations

from .frames import OWN as _OWN_PLACES
from .report import Finding

OWN = tuple("/" + place for place in _OWN_PLACES)  # as CompileWatch matches a frame's path
LESSON = "15"
# seconds the compile launch gets at least: a first compile takes a rank about a second on an
# idle 2-core machine and over 20 s at load average 11; the DDP phase, which ran first, already
# caught a module that hangs
COMPILE_TIMEOUT = 120.0


def probe(source, example, steps: int, loss, amp, ddp_kwargs, plan) -> dict:
    """One rank: the module under DDP and torch.compile, `steps` steps on this rank's batch."""
    import torch

    from ..instruments.compilewatch import CompileWatch
    from ..launching.rankinfo import device, rank_info
    from .dynamic import SEED, wrap
    from .inputs import autocast, call, move
    from .randomness import seed_all
    from .shapes import rank_batch

    rank, dev = rank_info().rank, device()
    seed_all(SEED + rank)
    model = source.build().to(dev)
    batch = move(rank_batch(example, rank, plan), dev)
    torch.compiler.reset()
    with CompileWatch(own=OWN) as watch:
        compiled = torch.compile(wrap(model, dev, ddp_kwargs), backend=watch.backend)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        for _ in range(steps):
            with autocast(amp, dev.type):
                total = loss(call(compiled, batch), batch)
            total.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            watch.step()
    return {"summary": watch.summary(), "graphs": watch.graphs, "lines": watch.lines}


def compiled_findings(source, example, steps, loss, amp, ddp_kwargs, plan, world_size, timeout, where):
    """Launch `probe` on `world_size` ranks; the findings of lesson 15. `where` is
    frames.code_map of the module (names code shipped by value)."""
    from ..launching.launcher import launch

    run = launch(probe, source, example, steps=steps, loss=loss, amp=amp, ddp_kwargs=ddp_kwargs,
                 plan=plan, world_size=world_size, timeout=max(timeout, COMPILE_TIMEOUT),
                 grace=2.0, label="doctor compile")
    if run.status != "ok":
        return [_failed(run, where)]
    values = run.values
    return (_breaks(values, where) + _recompiles(values, steps, where)
            + _differ(values, where))


def place(at: str, where: dict | None) -> str:
    """`file:line in fn: code` for a CompileWatch location, the file named even for code shipped
    by value (`<dynamic-code...>`), the path shortened so the report does not vary by machine."""
    import linecache
    import re

    from .trace import short_file

    m = re.match(r"(.+):(\d+) in (\S+)$", at or "")
    if not m:
        return at
    path, line, fn = m.group(1), int(m.group(2)), m.group(3)
    if path.startswith("<dynamic-code") and fn in (where or {}):
        real, first, last = where[fn]
        path = real if first <= line <= last else path
    code = linecache.getline(path, line).strip()
    return f"{short_file(path)}:{line} in {fn}" + (f": {code}" if code else "")


def _failed(run, where) -> Finding:
    from ..instruments.compilewatch import user_frame
    from .failures import brief

    root = run.root_cause
    if root.error is None:
        return Finding("error", "compile-run-failed", LESSON, "the module could not be trained "
                       "under torch.compile", [brief(run.describe_failure())])
    at, _ = user_frame(root.error.traceback, OWN)
    first = root.error.message.strip().splitlines()[0] if root.error.message.strip() else ""
    return Finding(
        "error", "fails-under-compile", LESSON,
        f"rank {root.rank} raised {root.error.type} under torch.compile (not without it)",
        [f"PyTorch: {brief(first)}"] + ([f"at {place(at, where)}"] if at else []),
        "the DDP phase ran this module eagerly without error: the failure is torch.compile's "
        "(often an eager error raised while tracing, with a different type: read the message)")


def _breaks(values: list[dict], where) -> list[Finding]:
    seen: dict = {}
    for rank, v in enumerate(values):
        for b in v["summary"]["user_breaks"]:
            seen.setdefault((b["where"], b["reason"]), []).append(rank)
    if not seen:
        return []
    side = any("side effect" in reason for _, reason in seen)
    ev = [f"{reason} at {place(at, where)} (rank{'s' if len(r) > 1 else ''} "
          f"{', '.join(map(str, r))})" for (at, reason), r in seen.items()]
    fix = ("keep side effects (attribute writes, logging, counters) out of checkpointed functions: "
           "do them in forward, outside the checkpoint" if side else
           "make that line traceable (no print, .item(), data-dependent Python branch or "
           "untraceable call inside forward), or move it out of forward")
    return [Finding("warning", "graph-break-in-module", LESSON,
                    f"torch.compile breaks the graph in the module ({len(seen)} place"
                    f"{'' if len(seen) == 1 else 's'}): the code around it runs uncompiled",
                    ev + ["PyTorch's reason is quoted; each break also splits DDPOptimizer's "
                          "graphs, and a break inside a checkpoint runs the whole checkpoint eagerly"],
                    fix)]


def _recompiles(values: list[dict], steps: int, where) -> list[Finding]:
    later = [sum(v["summary"]["recompiles_per_step"][1:]) for v in values]
    if not any(later) or steps < 2:
        return []
    first = next(r for v in values for r in v["summary"]["recompiles"])
    every = all(all(n > 0 for n in v["summary"]["recompiles_per_step"][1:]) for v in values)
    ev = [f"rank {r}: {n} recompile(s) in steps 2-{steps}" for r, n in enumerate(later)]
    ev.append(f"PyTorch's guard that failed: {first['guard']}"
              + (f" (at {place(first['where'], where)})" if first["where"] else ""))
    return [Finding(
        "warning", "recompiles-every-step" if every else "recompiles-after-first-step", LESSON,
        "torch.compile recompiles " + ("on every step" if every else "after the first step")
        + " with the same batch",
        ev + ["the batch is the same every step, so forward reads Python state that changes "
              "(an int attribute is a constant of the graph); past "
              "torch._dynamo.config.recompile_limit (8 in torch 2.13) dynamo runs the function "
              "uncompiled"],
        "keep state that changes every call in a tensor (a buffer updated in place), not in a "
        "Python int or float; or torch._dynamo.config.allow_unspec_int_on_nn_module = True")]


def _differ(values: list[dict], where) -> list[Finding]:
    ops = [v["graphs"] for v in values]
    if all(o == ops[0] for o in ops[1:]):
        return []
    ev = [f"rank {r}: {len(g)} graph(s), {sum(map(len, g))} ops" for r, g in enumerate(ops)]
    at = _first_difference(values)
    if at:
        ev.append(f"the first op only some ranks run comes from {place(at, where)}")
    return [Finding(
        "warning", "ranks-compile-different-graphs", LESSON,
        "the ranks compile different graphs (different ops, not only shapes)",
        ev + ["each rank compiles (and recompiles) on its own; while one compiles, the others "
              "wait in DDP's next all-reduce, and a path that depends on the data is compiled "
              "again wherever it changes"],
        "make forward take the same path on every rank: pad batches to the same shape, or branch "
        "on settings rather than on each rank's data")]


def _first_difference(values: list[dict]) -> str:
    """The user line of the first op that one rank's graphs have and rank 0's do not (or the
    other way round): the ops are aligned as a diff aligns lines."""
    from difflib import SequenceMatcher

    flat = [[(op, line) for g, ls in zip(v["graphs"], v["lines"]) for op, line in zip(g, ls)]
            for v in values]
    for other in flat[1:]:
        ops = SequenceMatcher(None, [op for op, _ in flat[0]], [op for op, _ in other], autojunk=False)
        for tag, i1, _, j1, _ in ops.get_opcodes():
            if tag in ("insert", "replace"):
                return other[j1][1]
            if tag == "delete":
                return flat[0][i1][1]
    return ""
