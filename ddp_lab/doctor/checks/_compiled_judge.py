"""The compiled check's judge for a watched run (compiled.py; the ranks' records from
_compiled_rank.py): fullgraph failures, recompiles every step, ranks compiling differently,
graph breaks in the script's code."""
from __future__ import annotations

import re

from ..userline import short_paths
from ._compiled_static import static_sizes
from .api import Finding

LESSON = "15"
DYNAMO_ERRORS = ("Unsupported", "UserError", "UncapturedHigherOrderOpError")  # torch/_dynamo/exc.py


def judge(ev) -> list[Finding]:
    """`ev`: a watched run's Evidence."""
    if not any(r.get("compiles") or r.get("compile-breaks") for r in ev.ranks):
        return []
    return _fullgraph(ev) + _recompiles(ev) + _differ(ev) + _breaks(ev)


def _site(ev, kind: str):
    return next((r["compile-sites"][kind] for r in ev.ranks if r.get("compile-sites")),
                {} if kind != "hooks" else [])


def _failed(ev) -> bool:
    if ev.run is not None and ev.run.status != "ok":
        return True
    return any(r.get("hung") or r.get("error") for r in ev.ranks)


def _fullgraph(ev) -> list[Finding]:
    rank, err = next(((r, x["error"]) for r, x in enumerate(ev.ranks) if x.get("error")
                      and x["error"].get("type") in DYNAMO_ERRORS), (None, None))
    if err is None:
        return []
    message = err.get("message", "")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    hints = [ln for ln in lines if ln.startswith("Hint:")][:2]
    traced = re.findall(r'File "(.+?)", line (\d+)', message.split("from user code:", 1)[-1])
    where, why = "", ""
    if "backwards hooks" in message:  # torch/_dynamo/variables/distributed.py:174
        where = next(iter(_site(ev, "hooks")), "")
        why = "the module backward hook registered here: dynamo cannot trace it without compiled autograd"
    elif traced and traced[-1][0].replace("\\", "/").endswith("torch/nn/parallel/distributed.py"):
        where = next((s.get("line", "") for r in ev.ranks for s in r.get("compile-settings", [])
                      if s.get("fullgraph") == "True"), "")
        why = ("fullgraph=True on the DDP wrapper: DDP's own forward breaks the graph "
               "(torch/nn/parallel/distributed.py), and DDPOptimizer splits it at every bucket")
    if not where:
        where = next((c["fail"]["at"] for c in ev.ranks[rank].get("compiles", [])
                      if c.get("fail", {}).get("at")), "") or err.get("line", "")
    ev_lines = [f"rank {rank}: PyTorch ({err['type']}): {short_paths(lines[0]) if lines else ''}"]
    if "DDP" not in why:  # for DDP's own break PyTorch's hints speak of code that is not the user's
        ev_lines += [short_paths(f"PyTorch's {h[0].lower()}{h[1:]}") for h in hints]
    if why:
        ev_lines.append(f"the cause: {why}")
    return [Finding(
        "error", "fullgraph-failed", LESSON,
        "torch.compile(fullgraph=True) cannot capture the model in one graph: the script fails",
        ev_lines, _fullgraph_fix(message, why), where=where)]


def _fullgraph_fix(message: str, why: str) -> str:
    if "backwards hooks" in message:
        return ("hook the module's parameters instead (p.register_hook or "
                "register_post_accumulate_grad_hook, registered before compiling: they run "
                "outside the graph; corpus 53's fixed script), enable compiled autograd as "
                "PyTorch's hint says, or drop fullgraph=True")
    if "DDP" in why:
        return ("compile the module, then wrap it: DDP(torch.compile(model, fullgraph=True)); or "
                "keep fullgraph=False on the DDP model (its breaks are DDP's own)")
    return ("make that line traceable (no data-dependent Python branch, .item(), print or "
            "untraceable call in the compiled code), or drop fullgraph=True")


def _recompiles(ev) -> list[Finding]:
    groups: dict = {}
    for rank, r in enumerate(ev.ranks):
        for c in r.get("compiles", []):
            g = c.get("recompile")
            if g and c["step"] >= 1:
                e = groups.setdefault((c["fn"], g["group"]), {"ranks": {}, "values": set(), "c": c})
                e["ranks"].setdefault(rank, set()).add(c["step"])
                e["values"].add(g["value"])
    found = []
    for (fn, group), e in groups.items():
        if max(len(s) for s in e["ranks"].values()) < 2 or len(e["values"]) < 2:
            continue
        g, c = e["c"]["recompile"], e["c"]
        where = _changed_at(ev, g, c)
        ev_lines = [f"rank {r}: {fn} recompiled in steps {', '.join(map(str, sorted(s)))}"
                    for r, s in sorted(e["ranks"].items())]
        ev_lines.append(f"PyTorch's guard that failed: {g['guard']}"
                        + (f" (read at {g['read']})" if g["read"] else ""))
        if g["hint"]:
            ev_lines.append(f"PyTorch's hint: {g['hint']}")
        own = _written_inside(ev, g)
        if own:
            ev_lines.append(f"the compiled function changes it itself at {own['writes'][0]} (dynamo "
                            f"replays that store after the graph) and reads it into the graph at "
                            f"{', '.join(own['loads'][:3])}: each call's value is the next call's "
                            "failed guard")
        static = static_sizes(ev, g)
        if static:
            where = static[0]
            ev_lines.append(static[1])
        ev_lines.append("past torch._dynamo.config.recompile_limit (8, torch/_dynamo/config.py:121) "
                        "dynamo stops compiling the function and runs it eagerly")
        what = ("an input's size changes between steps and each size is compiled anew"
                if g["shape"] else f"{g['name'] or 'a value'} changes between steps and is a "
                "constant of the compiled graph")
        fix = ("keep the size fixed (pad to it), or mark that dimension dynamic before the call "
               "(torch._dynamo.mark_dynamic(x, dim))" if g["shape"] else
               "keep what changes every step in a tensor (a buffer updated in place with .fill_(), "
               "or a tensor argument, e.g. lr=torch.tensor(0.01)), not in a Python int or float")
        fix = static[2] if static else fix
        found.append(Finding("warning", "recompiles-every-step", LESSON,
                             f"torch.compile recompiles {fn} every step: {what}", ev_lines, fix,
                             where=where))
    return found


def _written_inside(ev, g: dict) -> dict:
    """The function that read the guarded attribute, when it also writes it (a counter forward
    increments): {"writes", "loads"} (_compiled_paths.reads_of), else {}."""
    found = _site(ev, "reads").get(g.get("name") or "") or {}
    return found if found.get("writes") and found.get("loads") else {}


def _changed_at(ev, g: dict, c: dict) -> str:
    """The user's line at fault for a guard that fails every step. When the compiled function
    itself writes the attribute it reads (forward increments a counter), the line of that
    function that READS it into the graph (the value that becomes a constant; the write is a
    side effect dynamo replays); otherwise the line that changes it from outside: an assignment
    to that attribute or key, a keyword that sets it (an optimizer's lr=), else the call that
    passes it in."""
    name = g["name"]
    local = re.match(rf"^{re.escape(name)}\s*==", g["guard"]) if name else None
    own = _written_inside(ev, g) if name and not local else {}
    if own:
        return own["loads"][0]
    if name and not local:
        sites = _site(ev, "assign").get(name) or _site(ev, "keyword").get(name)
        if sites:
            return sites[0]
    return c.get("call") or g.get("read", "")


def _signature(c: dict) -> tuple:
    """A compiled graph, as the same graph on two ranks: its frame, its size and the grad mode
    it was traced under. Not the guard that failed: that says which graph the frame had
    compiled BEFORE (rank 0 compiling its eval graph first fails grad_mode on its training
    graph; rank 1 compiles that training graph fresh)."""
    return (c["fn"], c["file"], c["first"], c["ops"], c.get("grad"))


def _differ(ev) -> list[Finding]:
    from collections import Counter

    per = [{} for _ in ev.ranks]
    for rank, r in enumerate(ev.ranks):
        for c in r.get("compiles", []):
            per[rank].setdefault(c["step"], []).append(c)
    ended = min((len([s for s in ev.steps(r) if s.get("end")]) for r in range(len(ev.ranks))),
                default=0)
    failed = _failed(ev)
    for step in range(ended + (1 if failed else 0)):
        counts = [Counter(map(_signature, p.get(step, []))) for p in per]
        if all(c == counts[0] for c in counts[1:]):
            continue
        union = sum(counts, Counter())
        extra = [(r, c) for r, p in enumerate(per) for c in p.get(step, [])
                 if counts[r][_signature(c)] * len(counts) > union[_signature(c)]]
        if not extra:
            continue
        shape = all(c.get("recompile", {}).get("shape") for _, c in extra)
        alone = {r for r, _ in extra}
        nograd = all(c.get("grad") is False for _, c in extra)
        busy = all(per[r].get(step) for r in range(len(per)) if r not in alone)
        level = ("error" if failed and step >= ended else
                 "info" if shape or (nograd and busy) else "warning")
        return [_differ_finding(ev, per, step, extra, level, nograd, busy)]
    return []


def _differ_finding(ev, per, step, extra, level, nograd=False, busy=False) -> Finding:
    """`nograd`: every graph only some ranks compiled was traced under no_grad (an evaluation
    one rank runs alone); `busy`: every other rank compiled in that step too (the run's
    warm-up: no rank runs compiled while another compiles). Both: a note (nanoGPT evaluates
    on rank 0 at iteration 0); the same evaluation compiled later, while the others compile
    nothing and wait in the next all-reduce for the whole compile (corpus 52), a warning."""
    ev_lines = []
    for rank in range(len(ev.ranks)):
        mine = sorted(per[rank].get(step, []), key=lambda c: not c.get("user"))
        ev_lines.append(f"rank {rank}, step {step}: compiled " + (", ".join(
            f"{c['fn']} ({c['file']}:{c['first']}, {c['ops']} ops"
            + (f", guard failed: {c['recompile']['guard']}" if c.get("recompile") else "") + ")"
            for c in mine[:4]) or "nothing"))
    rank, first = extra[0]
    ev_lines.append("DDP's all-reduces stay in its reducer, so the sums stay right; but the rank "
                    "that compiles alone holds every other rank in the next all-reduce for the "
                    "whole compile (a collective timeout on a large model), and with compiler or "
                    "guard collectives the ranks hang")
    if level == "error":
        ev_lines.append("the run then failed or hung in that step")
    elif nograd and not busy:
        ev_lines.append("every graph compiled on one rank only was traced under no_grad (an "
                        "evaluation that rank runs alone), in a step in which the others compiled "
                        "nothing: they run compiled and wait in the next all-reduce for its whole "
                        "compile")
    elif nograd:
        ev_lines.append("every graph compiled on one rank only was traced under no_grad, in a "
                        "region that rank runs alone (evaluation on rank 0, as nanoGPT does), and "
                        "in a step in which every other rank compiled its own graphs too (the "
                        "warm-up): DDP's reducer is not involved (no backward) and no rank ran "
                        "compiled while it waited: a note; the same compile in a later step, "
                        "while the others compile nothing, is a warning")
    return Finding(
        level, "ranks-compile-differently", LESSON,
        f"the ranks compile differently in step {step}: rank {rank} compiles what the others do not",
        ev_lines,
        "run the compiled model the same way on every rank (evaluate on all ranks and log on "
        "rank 0, or evaluate with the uncompiled module); compile every mode before the loop on "
        "every rank (a warm-up step)", where=first.get("call", ""))


def _breaks(ev) -> list[Finding]:
    """Graph breaks in the script's code: a note, or a warning when the break recurs every step:
    dynamo traces it again in two or more steps after the first (it is recompiled), or it lies
    on the path of every call of a compiled module's forward (_compiled_paths.on_every_call)
    and that compiled callable ran in every step after the one that traced it, two at least
    (it is run: two graphs and Python between them, every step). A break under a Python branch
    (a logging path) or in code run on some steps only (evaluation, a warm-up) stays a note."""
    seen: dict = {}
    for rank, r in enumerate(ev.ranks):
        for b in r.get("compile-breaks", []):
            if b.get("where"):
                e = seen.setdefault((b["where"], b["reason"]), {"ranks": set(), "steps": {}, "b": b,
                                                                "every": {}})
                e["ranks"].add(rank)
                e["steps"].setdefault(rank, set()).add(b["step"])
                if "every_call" in b and rank not in e["every"]:
                    e["every"][rank] = _every_step(ev, rank, b)
    if not seen:
        return []
    again = [k for k, e in seen.items() if any(len({s for s in st if s >= 1}) >= 2
                                               for st in e["steps"].values())]
    every = [k for k, e in seen.items() if k not in again and e["every"]
             and all(e["every"].values())]
    ev_lines = [f"{where}: {reason}" + (f" ({e['b']['explain']})" if e["b"].get("explain") else "")
                + f" (rank{'s' if len(e['ranks']) > 1 else ''} {', '.join(map(str, sorted(e['ranks'])))})"
                for (where, reason), e in seen.items()]
    ev_lines.append("each break ends a graph: the code around it runs eagerly" + (
        ", and DDPOptimizer cuts the graphs on each side at DDP's buckets again" if _ddp_compiled(ev)
        else ""))
    if again:
        ev_lines.append("traced again in several steps: the break is recompiled, not only run")
    for key in every:
        steps = next(iter(seen[key]["every"].values()))
        ev_lines.append(f"{key[0].split(': ', 1)[0]}: on the path of every call of the compiled forward (under no "
                        f"Python branch of yours), which ran in every step after it was traced "
                        f"(steps {steps[0]}-{steps[1]}): dynamo compiled it once and runs it on "
                        "each call, the graph before it, Python for that line, the graph after it")
    loud = again + every
    first = loud[0] if loud else next(iter(seen))
    return [Finding(
        "warning" if loud else "info", "graph-break", LESSON,
        f"torch.compile breaks the graph in the script's code ({len(seen)} place"
        f"{'' if len(seen) == 1 else 's'})" + (", every step" if loud else ""), ev_lines,
        "make that line traceable (no print, .item(), data-dependent Python branch or "
        "untraceable call inside the compiled code: a branch on a tensor's value can be "
        "torch.where or an unconditional clamp), or move it out of forward", where=first[0])]


def _every_step(ev, rank: int, b: dict):
    """(first, last) step after the break's own in which its compiled callable ran, when it ran
    in each of them (two at least) and the break is on every call's path of a forward; else
    None."""
    ran = ev.ranks[rank].get("compile-ran") or []
    index = b.get("callable")
    if not (b.get("forward") and b.get("every_call")) or index is None or index >= len(ran):
        return None
    called = {s for a, z in ran[index] for s in range(a, z + 1)}
    after = range(b["step"] + 1, len([s for s in ev.steps(rank) if s.get("end")]))
    if len(after) < 2 or any(s not in called for s in after):
        return None
    return after[0], after[-1]


def _ddp_compiled(ev) -> bool:
    """A DDP model under torch.compile (compiled around DDP, or DDP around a compiled module)."""
    return any((m["kind"] == "compiled" and m["type"] == "DistributedDataParallel")
               or (m["kind"] == "ddp" and m["type"] == "OptimizedModule")
               for r in ev.ranks for m in r.get("models", []))
