"""Findings from the measurements of the DDP phase: what differs between ranks after DDP is
built and after the training steps, parameters that never change, non-finite numbers, and
collectives per step."""
from __future__ import annotations

from ..report import Finding
from .analyze import TOL
from .static import names

SMALL_BATCH = 32  # BatchNorm statistics over fewer values per channel than this are noisy


def _drifted(table: dict | None) -> list[tuple[str, float | None]]:
    table = table or {}
    return sorted(((n, d) for n, d in table.items() if d is None or not d <= TOL),
                  key=lambda nd: (-(nd[1] if nd[1] is not None else float("inf")), nd[0]))


def _fmt(items) -> list[str]:
    return [f"{n}: max |difference| {d:.3g}" if d is not None else f"{n}: not on every rank"
            for n, d in items[:8]] + ([f"(and {len(items) - 8} more)"] if len(items) > 8 else [])


def measure_findings(rec0: dict, steps: int, unused: set[str],
                     explained: dict[str, set] | None = None) -> list[Finding]:
    """`explained`: {state kind: names} a mechanism finding already accounts for."""
    bn_sizes = (rec0.get("dry") or {}).get("batchnorm", {})
    start = _without(rec0.get("drift_start"), explained)
    out = _drift(start, "after DDP was built", bn_sizes)
    later = _drift(_without(rec0.get("drift_end"), explained), f"after {steps} step(s)", bn_sizes,
                   skip=start)
    out += _fold(out, later, f"after {steps} step(s) also")
    out += _unchanged(rec0.get("unchanged"), unused, steps)
    out += _nonfinite(rec0)
    return out


def _without(table: dict | None, explained: dict[str, set] | None) -> dict | None:
    if not table or not explained:
        return table
    return {k: {n: d for n, d in v.items() if n not in explained.get(k, ())}
            for k, v in table.items()}


def _fold(first: list[Finding], later: list[Finding], prefix: str) -> list[Finding]:
    """Later findings of a check that already reported: their names join the first finding."""
    by_code = {f.code: f for f in first}
    new = []
    for f in later:
        if f.code in by_code:
            names_ = [e for e in f.evidence if "max |difference|" in e or "not on every rank" in e]
            by_code[f.code].evidence += [f"{prefix}: {e}" for e in names_]
        else:
            new.append(f)
    return new


def _drift(table: dict | None, when: str, bn_sizes: dict, skip: dict | None = None) -> list[Finding]:
    if not table:
        return []
    seen = {k: {n for n, _ in _drifted(v)} for k, v in (skip or {}).items()}
    out = []
    params = [x for x in _drifted(table.get("parameter")) if x[0] not in seen.get("parameter", ())]
    if params:
        out.append(Finding(
            "error", "parameters-differ-between-ranks", "01",
            f"{len(params)} parameter(s) differ between ranks {when}", _fmt(params)
            + ["DDP keeps registered parameters equal (same start, averaged gradients): these "
               "escaped it, by a way the doctor did not observe (not written in forward or "
               "backward, not frozen by rank): look for in-place edits outside the optimizer"],
            "update parameters only through the optimizer, identically on every rank"))
    hidden = [x for x in _drifted(table.get("unregistered"))
              if x[0] not in seen.get("unregistered", ())]
    if hidden:
        out.append(Finding(
            "error", "unregistered-trainable-differs", "01",
            f"{len(hidden)} unregistered trainable tensor(s) differ between ranks {when}",
            _fmt(hidden) + ["DDP broadcasts and averages only registered parameters: each rank "
                            "trains its own copy of these"],
            "make them nn.Parameter; put sub-modules in nn.ModuleList / nn.ModuleDict"))
    state = [x for x in _drifted(table.get("unregistered_state"))
             if x[0] not in seen.get("unregistered_state", ())]
    if state:
        out.append(Finding(
            "warning", "unregistered-state-differs", "08",
            f"{len(state)} plain tensor(s) the module keeps differ between ranks {when}",
            _fmt(state) + ["state the module computes from each rank's own data (or builds at "
                           "random): DDP never synchronises it, state_dict() does not save it"],
            "if every rank must agree, register a buffer and compute it from all-reduced "
            "statistics; if it is per-rank scratch, keep it out of anything saved or compared"))
    out += _buffers(_drifted(table.get("buffer")), when, seen.get("buffer", set()), bn_sizes)
    return out


def _buffers(buffers, when: str, seen: set, bn_sizes: dict) -> list[Finding]:
    buffers = [b for b in buffers if b[0] not in seen]
    bn = [b for b in buffers if b[0].rpartition(".")[0] in bn_sizes]
    own = [b for b in buffers if b not in bn]
    out = []
    if bn:
        out.append(_batchnorm(bn, when, bn_sizes))
    if own:
        out.append(Finding(
            "warning", "buffers-differ-between-ranks", "08",
            f"{len(own)} buffer(s) differ between ranks {when}", _fmt(own)
            + ["forward updates these from each rank's own data; DDP copies rank 0's over the "
               "others at the next forward, so the other ranks' data never reaches them"],
            "compute the update from statistics every rank agrees on (all_reduce the batch "
            "sums and counts before updating the buffer)"))
    return out


def _batchnorm(bn, when: str, bn_sizes: dict) -> Finding:
    layers = sorted({n.rpartition(".")[0] for n, _ in bn})
    smallest = min(bn_sizes[layer] for layer in layers)
    per_layer = f"values per channel each rank normalises over: " + ", ".join(
        f"{layer or '(root)'} {bn_sizes[layer]}" for layer in layers[:6])
    if smallest < SMALL_BATCH:
        return Finding(
            "warning", "batchnorm-small-per-rank-batch", "08",
            f"BatchNorm normalises over only {smallest} value(s) per channel on each rank",
            [per_layer] + _fmt(bn) + [
                "each rank normalises with its own small batch's statistics: 2 ranks do not "
                "train what one process on the global batch would, and the running statistics "
                "differ"],
            "nn.SyncBatchNorm.convert_sync_batchnorm(model) on GPUs; on the CPU all-reduce the "
            "batch sums and counts in the norm layer (lesson 08), or use larger per-rank batches")
    return Finding(
        "info", "batchnorm-buffers-differ", "08",
        f"BatchNorm running statistics differ between ranks {when}", [per_layer] + _fmt(bn)
        + ["each rank normalises with its own batch; DDP copies rank 0's buffers to the others "
           "at the start of each forward that follows a grad-enabled one, so checkpoints from "
           "rank 0 are consistent"],
        "nothing to do with batches this large; with small per-rank batches use "
        "nn.SyncBatchNorm (GPU)")


def _unchanged(unchanged: list | None, unused: set[str], steps: int) -> list[Finding]:
    still = [n for n in (unchanged or []) if n not in unused]
    if not still:
        return []
    return [Finding(
        "warning", "parameters-never-change", "01",
        f"{len(still)} parameter(s) did not change in {steps} training step(s)",
        [names(still)] + ["they get a zero gradient: detached from the loss (.detach(), .data, "
                          "torch.no_grad in forward) or multiplied by zero"],
        "check that forward uses them on the path to the output, without .detach() or .data")]


def _nonfinite(rec0: dict) -> list[Finding]:
    bad = sorted(set((rec0.get("dry") or {}).get("nonfinite_grads", []))
                 | set((rec0.get("steps") or {}).get("nonfinite_grads", [])))
    losses = (rec0.get("steps") or {}).get("losses", [])
    bad_loss = [i for i, x in enumerate(losses) if x != x or x in (float("inf"), float("-inf"))]
    if not bad and not bad_loss:
        return []
    ev = [f"non-finite gradients: {names(bad)}"] if bad else []
    ev += [f"non-finite loss at step(s) {bad_loss}"] if bad_loss else []
    return [Finding(
        "error", "non-finite-values", "04", "inf or NaN in the loss or the gradients", ev,
        "fp16 overflows above 65504 and underflows below 6e-8: use bf16, or fp16 with "
        "torch.amp.GradScaler; keep reductions (softmax, norms, losses) in float32")]


def step_collective_findings(recs: list[dict]) -> list[Finding]:
    per_rank = [(r.get("steps") or {}).get("collectives") for r in recs]
    if any(p is None for p in per_rank) or len({str(p) for p in per_rank}) <= 1:
        return []
    return [Finding(
        "error", "rank-dependent-collectives", "03",
        "training steps call different collectives on different ranks",
        [f"rank {r}: {p}" for r, p in enumerate(per_rank)],
        "call every collective on every rank, in the same order")]
