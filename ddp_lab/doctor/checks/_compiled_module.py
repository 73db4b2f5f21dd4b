"""The compiled check's judge for the doctor (compiled.py): the module under torch.compile with
the user's own settings (exam/compile_run.py runs it; `compile=True` or `compile={"fullgraph":
True, ...}`): what fails, breaks, recompiles with the same batch, or differs between ranks."""
from __future__ import annotations

from ...instruments.compilewatch import user_frame
from ..frames import SLASHED_OWN, in_dynamo
from ..userline import at_line, place
from .api import Finding, brief

LESSON = "15"
HOOKS = "backwards hooks"  # dynamo's reason for a module-level backward hook (distributed.py:174)
# a hook on the parameter runs when its gradient is accumulated, outside the compiled graph
# (corpus case 10's fix); a tensor hook registered in forward is traced, and its side effects
# (an attribute write) fail under fullgraph ("HOP: Unsafe side effect")
HOOK_FIX = ("a module-level backward hook cannot be traced without compiled autograd: hook the "
            "parameters instead (p.register_post_accumulate_grad_hook, which runs outside the "
            "graph), or set torch._dynamo.config.compiled_autograd = True (PyTorch's hint)")


def judge(ev) -> list[Finding]:
    """`ev`: the compile launch's Evidence (per rank, its value: summary, graphs, lines; {}
    when it raised; and its records: hook_sites), `ev.subject` (steps, the compile settings)
    and `ev.where` (code ranges of the module)."""
    if ev.run.status != "ok":
        return [_failed(ev)]
    return _breaks(ev) + _recompiles(ev) + _differ(ev)


def _hook_sites(ev) -> list[dict]:
    return next((r["hook_sites"] for r in ev.ranks if r.get("hook_sites")), [])


def _failed(ev) -> Finding:
    root = ev.run.root_cause
    if root is None or root.error is None:
        return Finding("error", "fails-under-compile", LESSON, "the module could not be trained "
                       "under torch.compile (not without it)", [brief(ev.run.describe_failure())])
    message = root.error.message.strip()
    first = message.splitlines()[0] if message else ""
    at, _ = user_frame(root.error.traceback + "\n" + root.error.message, SLASHED_OWN)
    dynamo = in_dynamo(root.error.traceback)
    if not (ev.subject.compile["fullgraph"] and dynamo):
        return Finding(
            "error", "fails-under-compile", LESSON,
            f"rank {root.rank} raised {root.error.type} under torch.compile (not without it)",
            [f"PyTorch: {brief(first)}"] + ([f"at {place(at, ev.where)}"] if at else []),
            "the DDP phase ran this module eagerly without error: the failure is torch.compile's "
            "(often an eager error raised while tracing, with a different type: read the message)",
            where=at_line(at, ev.where))
    ev_lines = [f"PyTorch ({root.error.type}): {brief(first)}"]
    hint = next((ln.strip() for ln in message.splitlines() if ln.strip().startswith("Hint:")), "")
    if hint:
        ev_lines.append(f"PyTorch's {hint[0].lower()}{hint[1:]}")
    where = at_line(at, ev.where)
    if at:
        ev_lines.append(f"dynamo stopped at {place(at, ev.where)}")
    sites = _hook_sites(ev) if HOOKS in message else []
    if sites:
        ev_lines += [f"{s['module']}.{s['call']} registered at {place(s['where'], ev.where)}"
                     for s in sites]
        where = at_line(sites[0]["where"], ev.where) or where
    return Finding(
        "error", "fullgraph-failed", LESSON,
        f"torch.compile(fullgraph=True) fails on rank {root.rank}: {brief(first, 120)}",
        ev_lines, _fullgraph_fix(message, sites), where=where)


def _fullgraph_fix(message: str, sites: list) -> str:
    if sites:
        return HOOK_FIX + ", or compile with fullgraph=False (the module then runs uncompiled)"
    if "item()" in message or "data-dependent" in message.lower():
        return ("keep the value a tensor: torch.where / torch.clamp instead of a Python branch "
                "on .item() or a tensor's truth value; or torch.cond for real control flow")
    return ("make that line traceable (no print, logging, .item(), data-dependent branch or "
            "untraceable call inside forward), move it out of forward, or drop fullgraph=True")


def _breaks(ev) -> list[Finding]:
    seen: dict = {}
    for rank, v in enumerate(ev.ranks):
        for b in v.get("summary", {}).get("user_breaks", []):
            seen.setdefault((b["where"], b["reason"]), []).append(rank)
    if not seen:
        return []
    side = any("side effect" in reason for _, reason in seen)
    ev_lines = [f"{reason} at {place(at, ev.where)} (rank{'s' if len(r) > 1 else ''} "
                f"{', '.join(map(str, r))})" for (at, reason), r in seen.items()]
    first_at, first_reason = next(iter(seen))
    sites = _hook_sites(ev) if HOOKS in first_reason else []
    ev_lines += [f"{s['module']}.{s['call']} registered at {place(s['where'], ev.where)}"
                 for s in sites]
    fix = ("keep side effects (attribute writes, logging, counters) out of checkpointed functions: "
           "do them in forward, outside the checkpoint" if side else
           HOOK_FIX + "; until then the hooked module runs uncompiled" if sites else
           "make that line traceable (no print, .item(), data-dependent Python branch or "
           "untraceable call inside forward), or move it out of forward")
    return [Finding("warning", "graph-break", LESSON,
                    f"torch.compile breaks the graph in the module ({len(seen)} place"
                    f"{'' if len(seen) == 1 else 's'}): the code around it runs uncompiled",
                    ev_lines + ["PyTorch's reason is quoted; each break also splits "
                                "DDPOptimizer's graphs, and a break inside a checkpoint runs the "
                                "whole checkpoint eagerly"],
                    fix, where=at_line(sites[0]["where"] if sites else first_at, ev.where))]


def _recompiles(ev) -> list[Finding]:
    per_step = [v.get("summary", {}).get("recompiles_per_step", []) for v in ev.ranks]
    later = [sum(s[1:]) for s in per_step]
    if not any(later) or ev.subject.steps < 2:
        return []
    first = next(r for v in ev.ranks for r in v["summary"]["recompiles"])
    every = all(all(n > 0 for n in s[1:]) for s in per_step)
    lines = [f"rank {r}: {n} recompile(s) in steps 2-{ev.subject.steps}" for r, n in enumerate(later)]
    lines.append(f"PyTorch's guard that failed: {first['guard']}"
                 + (f" (at {place(first['where'], ev.where)})" if first["where"] else ""))
    if ev.subject.compile.get("dynamic") is False:
        lines.append("dynamic=False: every new value of an int the graph reads is a new graph "
                     "(dynamo never makes it symbolic), until the recompile limit")
    return [Finding(
        "warning", "recompiles-" + ("every-step" if every else "after-first-step"),
        LESSON,
        "torch.compile recompiles " + ("on every step" if every else "after the first step")
        + " with the same batch",
        lines + ["the batch is the same every step, so forward reads Python state that changes "
                 "(an int attribute is a constant of the graph); past "
                 "torch._dynamo.config.recompile_limit (8 in torch 2.13) dynamo runs the function "
                 "uncompiled"],
        "keep state that changes every call in a tensor (a buffer updated in place), not in a "
        "Python int or float; or torch._dynamo.config.allow_unspec_int_on_nn_module = True",
        where=at_line(first["where"], ev.where))]


def _differ(ev) -> list[Finding]:
    ops = [v.get("graphs", []) for v in ev.ranks]
    if all(o == ops[0] for o in ops[1:]):
        return []
    lines = [f"rank {r}: {len(g)} graph(s), {sum(map(len, g))} ops" for r, g in enumerate(ops)]
    at = _first_difference(ev.ranks)
    if at:
        lines.append(f"the first op only some ranks run comes from {place(at, ev.where)}")
    return [Finding(
        "warning", "ranks-compile-differently", LESSON,
        "the ranks compile different graphs (different ops, not only shapes)",
        lines + ["each rank compiles (and recompiles) on its own; while one compiles, the others "
                 "wait in DDP's next all-reduce, and a path that depends on the data is compiled "
                 "again wherever it changes"],
        "make forward take the same path on every rank: pad batches to the same shape, or branch "
        "on settings rather than on each rank's data", where=at_line(at, ev.where))]


def _first_difference(values: list[dict]) -> str:
    """The user line of the first op that one rank's graphs have and rank 0's do not (or the
    other way round): the ops are aligned as a diff aligns lines."""
    from difflib import SequenceMatcher

    flat = [[(op, line) for g, ls in zip(v.get("graphs", []), v.get("lines", []))
             for op, line in zip(g, ls)] for v in values]
    for other in flat[1:]:
        ops = SequenceMatcher(None, [op for op, _ in flat[0]], [op for op, _ in other], autojunk=False)
        for tag, i1, _, j1, _ in ops.get_opcodes():
            if tag in ("insert", "replace"):
                return other[j1][1]
            if tag == "delete":
                return flat[0][i1][1]
    return ""
