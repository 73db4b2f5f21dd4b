"""From what the ranks recorded (sync.records of each rank's stdout) to findings."""
from __future__ import annotations

from ..report import Finding
from .randomness import random_findings
from .static import names

TOL = 1e-6  # parameters DDP keeps in sync are bitwise equal; anything above this drifted


def _per_rank(recs: list[dict], key: str) -> list:
    return [r.get(key) for r in recs]


def dry_findings(recs: list[dict], amp: str | None, settings: dict | None = None) -> list[Finding]:
    drys = [r["dry"] for r in recs if "dry" in r]
    if not drys:
        return []
    out = []
    out += _births(drys)
    out += _unused(recs, drys, settings or {})
    out += _collectives(drys)
    out += _factories(drys[0])
    out += _checkpoints(drys[0])
    out += _graph_kept(drys[0])
    out += _custom_functions(drys[0], amp)
    out += random_findings(recs)
    return out


def _births(drys) -> list[Finding]:
    births = sorted({b for d in drys for b in d.get("parameter_births", [])})
    registered = sorted({n for d in drys for n in d.get("registered_in_forward", [])})
    if not births and not registered:
        return []
    ev = [f"created in forward: {b}" for b in births]
    ev += [f"registered (or replaced) during forward: {names(registered)}"] if registered else []
    return [Finding(
        "error", "parameter-created-in-forward", "01", "nn.Parameter created inside forward",
        ev + ["a parameter born in forward is new every step: the optimizer and DDP hold the "
              "old one, so it is never trained, nor synchronised between ranks"],
        "create every parameter once, in __init__; in forward only use it")]


FIND_UNUSED = "find_unused_parameters=True"


def _unused(recs, drys, settings: dict) -> list[Finding]:
    sets = [tuple(d.get("unused", [])) for d in drys]
    if not any(sets):
        return []
    if len(set(sets)) > 1:
        return [_rank_dependent_unused(sets, settings)]
    messages = [m for m in _per_rank(recs, "unused_error") if m]
    ev = [f"no gradient on any rank: {names(sets[0])}"]
    ev += [f"PyTorch, on the 2nd step under a plain DDP: {_first(messages[0])}",
           _names_line(messages[0])] if messages else []
    handled = [k for k in ("find_unused_parameters", "static_graph") if settings.get(k)]
    if handled:
        return [Finding(
            "info", "unused-parameters", "01", f"{len(sets[0])} parameter(s) receive no "
            f"gradient, which {handled[0]}=True (your setting) handles", ev,
            "nothing to do under your settings; without them DDP fails on the second step")]
    fails = ("DDP fails on the second step" if messages else
             "a plain DDP did not fail here, but expects a gradient for each")
    return [Finding(
        "error", "unused-parameters", "01",
        f"{len(sets[0])} parameter(s) receive no gradient: {fails}",
        [e for e in ev if e] + [f"this finding goes away under {FIND_UNUSED} or "
                                "static_graph=True (if the same ones are unused every step)"],
        "use every parameter in forward (or delete the unused ones); if some are truly unused "
        "on some steps, DDP(find_unused_parameters=True) (an extra graph traversal each step)")]


def _rank_dependent_unused(sets, settings: dict) -> Finding:
    ev = [f"rank {r}: {names(s) or 'none unused'}" for r, s in enumerate(sets)]
    if settings.get("find_unused_parameters"):
        return Finding(
            "info", "rank-dependent-unused-parameters", "01",
            f"different parameters go unused on different ranks, which {FIND_UNUSED} "
            "(your setting) handles", ev + [
                "DDP finds each step's unused parameters by walking the graph, and all-reduces "
                "a zero gradient for them (LayerDrop, stochastic depth, expert routing)"],
            "nothing to do under your settings; it costs one graph traversal per step")
    return Finding(
        "error", "rank-dependent-unused-parameters", "01",
        "different parameters go unused on different ranks", ev
        + ["DDP's reducer waits for a gradient that one rank never produces: the gradient "
           "buckets and all-reduces no longer match between ranks",
           f"this finding goes away under {FIND_UNUSED} (LayerDrop, stochastic depth and "
           "expert routing need it)"],
        "make forward use the same parameters on every rank (no branches on rank or on "
        "data that differs by rank), or DDP(find_unused_parameters=True)")


def _first(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


def _names_line(message: str) -> str:
    for line in message.splitlines():
        if "did not receive grad" in line and "Parameters" in line:
            return "PyTorch: " + line.strip()
    return ""


def _collectives(drys) -> list[Finding]:
    calls = [d.get("collectives", []) for d in drys]
    if not any(calls):
        return []
    ev = [f"rank {r}: {len(c)} call(s){': ' if c else ''}{names(sorted(set(c)), 4)}"
          for r, c in enumerate(calls)]
    if len({len(c) for c in calls}) > 1 or len({tuple(_kind(c)) for c in calls}) > 1:
        return [Finding(
            "error", "rank-dependent-collectives", "03",
            "forward calls different collectives on different ranks", ev
            + ["a collective that only some ranks call waits for the others for ever, or pairs "
               "with a different collective on them"],
            "call every collective on every rank, in the same order; log on one rank, compute "
            "on all")]
    evals = [d.get("eval_collectives") for d in drys]
    if all(e == [] for e in evals):
        return [Finding(
            "info", "collective-in-training-forward", "03",
            "forward calls torch.distributed collectives in training mode only",
            ev + ["in eval mode it calls none, so one rank can evaluate alone; in training every "
                  "rank must run forward together"],
            "nothing to do while every rank trains in step")]
    return [Finding(
        "warning", "collective-in-forward", "03", "forward calls torch.distributed collectives",
        ev + ["every rank must then run forward together: evaluation on rank 0 alone (or any "
              "forward only some ranks make) hangs in this collective"],
        "keep collectives out of forward (do them in the training step, on every rank), or "
        "guard them with dist.is_initialized() and run evaluation on every rank")]


def _kind(calls: list[str]) -> list[str]:
    return [c.split("(")[0] for c in calls]


def _factories(dry) -> list[Finding]:
    if not dry.get("factories"):
        return []
    return [Finding(
        "warning", "tensor-created-without-device", "02",
        "tensors created in forward without a device land on the CPU",
        dry["factories"] + ["on the CPU this runs; on a GPU it raises 'Expected all tensors to be "
                            "on the same device'"],
        "create them from the input: x.new_zeros(...), torch.zeros(..., device=x.device, "
        "dtype=x.dtype), or keep constants as buffers")]


def _checkpoints(dry) -> list[Finding]:
    regions = dry.get("checkpoints", [])
    out = []
    reentrant = [r["where"] for r in regions if r["reentrant"]]
    if reentrant:
        warns = [w for w in dry.get("warnings", []) if "requires_grad" in w or "use_reentrant" in w]
        out.append(Finding(
            "warning", "reentrant-checkpoint", "05",
            f"{len(reentrant)} reentrant checkpoint(s) (use_reentrant=True)",
            [f"checkpointed at {names(sorted(set(reentrant)), 4)}"]
            + [f"PyTorch warned: {w}" for w in warns]
            + ["under DDP a reentrant checkpoint runs its backward outside DDP's view: with "
               "find_unused_parameters=True, or a region checkpointed twice, the reducer marks a "
               "parameter ready twice; with inputs that need no grad, the region's parameters get "
               "no gradient"],
            "torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)"))
    random = sorted({r["where"] for r in regions if r["rng_used"] and not r["preserve_rng"]})
    if random:
        out.append(Finding(
            "warning", "checkpoint-rng-not-preserved", "05",
            "a checkpointed region draws random numbers with preserve_rng_state=False",
            [f"checkpointed at {names(random, 4)}", "the recomputation in backward draws new "
             "numbers (a new dropout mask): the gradients belong to a network that never ran"],
            "keep preserve_rng_state=True (the default)"))
    changed = dry.get("changed_in_backward", [])
    if changed and regions:
        out.append(Finding(
            "warning", "checkpoint-side-effect", "05",
            "module state changes during backward: a checkpointed region repeats its side effects",
            [f"changed while backward recomputed the region: {names(changed, 6)}",
             "the recomputation runs forward's code again: counters count twice, lists grow "
             "twice, buffers update twice; with other shapes use_reentrant=False raises, with "
             "the same shapes the gradients are silently wrong"],
            "keep side effects (counters, caches, buffer updates) outside the checkpointed "
            "function, once per step"))
    return out


def _graph_kept(dry) -> list[Finding]:
    kept = dry.get("graph_kept", [])
    if not kept:
        return []
    return [Finding(
        "warning", "graph-kept-across-steps", "05",
        "the module keeps tensors that still carry this step's autograd graph", [names(kept, 4)]
        + ["the next step's backward runs into this step's freed graph ('Trying to backward "
           "through the graph a second time'); retain_graph=True only hides it and memory grows "
           "every step"],
        "store .detach()ed values between steps")]


def _custom_functions(dry, amp) -> list[Finding]:
    plain = sorted(n for n, ok in dry.get("custom_functions", {}).items() if not ok)
    if not plain:
        return []
    sev, when = ("warning", "under autocast") if amp else ("info", "if you train under autocast")
    return [Finding(
        sev, "custom-function-without-custom-fwd", "04",
        "custom autograd Function(s) without torch.amp.custom_fwd / custom_bwd",
        [f"{names(plain)}: {when}, backward runs without autocast, and receives gradients in "
         "a dtype its forward did not produce"],
        "decorate forward with @torch.amp.custom_fwd(device_type=...) and backward with "
        "@torch.amp.custom_bwd(device_type=...)")]
