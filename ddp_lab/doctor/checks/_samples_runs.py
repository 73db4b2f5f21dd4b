"""The samples check's judges over the whole run (samples.py records each rank's epochs, with the
first HEAD indices each drew, in order, and the backward() calls made while it was iterated):

- epoch-order-replayed: a training epoch (an optimizer step ended during it) whose shuffled order
  is an earlier training epoch's, on the same data, whichever DataLoader or sampler drew them
  (after a resume, a new DistributedSampler starts at epoch 0 again and seeds its permutation
  with seed + epoch, torch/utils/data/distributed.py:111). Compared: the common prefix of the
  two orders, on every rank, and only where that prefix could not repeat by chance (at least
  BITS bits of a permutation); an epoch equal to the one just before it, with the same
  DistributedSampler epoch, is sampler-epoch-not-set's. Evaluation passes (no optimizer step
  while iterated), loaders over other data, and an epoch that began before the other drew its
  last batch (two loaders over one dataset in lockstep, two views of each sample) are not
  compared.
- eval-sampler-pads: an evaluation pass (run to its end, no backward and no optimizer step while
  iterated) over a DistributedSampler(drop_last=False) whose total_size exceeds the dataset: it
  repeats total_size - len(dataset) samples so every rank gets the same count
  (distributed.py:116-120), and they enter a metric of the whole set when the ranks' results are
  combined (a reducing or gathering collective before training resumes). A metric each rank keeps
  to itself is of its share only: rank 0's share never holds a padded repeat (the repeats take
  the last positions, ranks len % W .. W-1)."""
from __future__ import annotations

import math

from ._samples_data import decode
from ._samples_judge import KEY, training
from .api import Finding

BITS = 30  # a prefix of a shuffled order repeats by chance with probability under 2**-BITS


def replays(ev) -> list[Finding]:
    found: dict = {}
    for r, rank in enumerate(ev.ranks):
        for key, item in _replays_on(rank.get(KEY) or []):
            found.setdefault(key, {})[r] = item
    out = []
    for key, per_rank in sorted(found.items(), key=lambda kv: min(i[3]["seq"] for i in kv[1].values())):
        first = next(iter(per_rank.values()))
        n, heads = first[4], [i[5] for i in per_rank.values()]
        bits = (_bits(n, sum(heads)) if first[2]["sampler"]["distributed"]
                else sum(_bits(n, m) for m in heads))
        if bits >= BITS:
            out.append(_replayed(per_rank, len(found)))
            break
    return out


def _replays_on(loaders) -> list:
    """((line, k) of the replaying epoch and of the one it replays, (loader, epoch, loader,
    epoch, n, common prefix)) for each training epoch of this rank that replays an earlier one."""
    trained = []
    for loader in loaders:
        s, d = loader["sampler"], loader["dataset"]
        if not s.get("shuffles") or d.get("iterable"):
            continue
        data = (d.get("type"), d.get("fingerprint"), d.get("len"),
                tuple(x.get("set") for x in d.get("layers") or []))
        n = s.get("dataset_len") or s.get("len")
        trained += [(e["seq"], data, n, loader, e) for e in loader["epochs"]
                    if training(e) and e.get("head") and not e["unindexed"]]
    trained.sort(key=lambda t: t[0])
    out = []
    for j, (_, data, n, loader, b) in enumerate(trained):
        earlier = [t for t in trained[:j] if t[1] == data]
        if not earlier or not n:
            continue
        prev = earlier[-1]
        if (prev[3]["line"] == loader["line"] and loader["sampler"]["distributed"]
                and prev[4]["sampler_epoch"] == b["sampler_epoch"] and _same(prev[4], b)):
            continue  # consecutive, the sampler's epoch unchanged: sampler-epoch-not-set's
        for _, _, _, la, a in earlier:
            if _same(a, b) and a.get("last", 0) <= b["seq"]:  # a drew its last before b began
                m = min(len(a["head"]), len(b["head"]))
                out.append((((loader["line"], b["k"]), (la["line"], a["k"])), (la, a, loader, b, n, m)))
                break
    return out


def _same(a, b) -> bool:
    m = min(len(a["head"]), len(b["head"]))
    return a["head"][:m] == b["head"][:m]


def _bits(n: int, m: int) -> float:
    """log2 of the number of ordered choices of m out of n: a prefix's worth as evidence."""
    return sum(math.log2(n - i) for i in range(min(m, n)))


def _replayed(per_rank, count: int) -> Finding:
    evidence = []
    for r, (la, a, lb, b, n, m) in sorted(per_rank.items()):
        evidence.append(
            f"rank {r}: the training epoch begun at step {b['start']} (epoch {b['k']} of its "
            f"DataLoader line, sampler epoch {b['sampler_epoch']}) drew its first {m} samples in "
            f"the order of the one begun at step {a['start']} (epoch {a['k']}, sampler epoch "
            f"{a['sampler_epoch']}): "
            + ", ".join(map(str, b["head"][:8])) + (", ..." if m > 8 else ""))
    la, a, lb, b, n, m = next(iter(per_rank.values()))
    evidence.append(f"the replayed epoch's DataLoader: {la['line']}; the replaying one's: {lb['line']}"
                    + (f"; its sampler: {lb['sampler']['line']}" if lb["sampler"]["line"] else ""))
    if b["line"] and b["began"] and b["line"] != b["began"]:
        evidence.append(f"iterated at {b['line']}, inside the loop built at {b['began']}")
    if count > 1:
        evidence.append(f"{count} training epochs replay an earlier one")
    return Finding(
        "warning", "epoch-order-replayed", "07",
        "a training epoch replays an earlier epoch's order: the same samples in the same order "
        "again, as if the run had restarted", evidence=evidence, where=b["began"] or b["line"],
        fix="continue the epoch count where the run left it: after a resume, call "
            "sampler.set_epoch(epoch) with the epoch saved in the checkpoint (or derived from the "
            "step: step // len(loader)), not from 0; a new DistributedSampler starts at epoch 0 "
            "and seeds its permutation with seed + epoch (torch/utils/data/distributed.py:111), a "
            "RandomSampler from its generator: save and restore that generator's state")


def eval_padding(ev) -> list[Finding]:
    found: dict = {}
    for r, rank in enumerate(ev.ranks):
        for loader in rank.get(KEY) or []:
            s = loader["sampler"]
            if not (s["distributed"] and not s["sampler_drop_last"]
                    and s["total_size"] > s["dataset_len"]):
                continue
            evals = [e for e in loader["epochs"] if e["complete"] and e["end"] == e["start"]
                     and e["n"] and not e.get("backwards") and e.get("reduced")]
            if evals:
                found.setdefault(loader["line"], {})[r] = (loader, evals)
    return [_padded(per_rank) for per_rank in found.values()]


def _padded(per_rank) -> Finding:
    loader, evals = next(iter(per_rank.values()))
    s = loader["sampler"]
    pad, n, total = s["total_size"] - s["dataset_len"], s["dataset_len"], s["total_size"]
    sets = [decode(ev[0]["set"]) for _, ev in per_rank.values() if ev[0].get("set")]
    seen = [i for i in range(n) if sum(i in x for x in sets) > 1] if len(sets) > 1 else []
    evidence = [f"DistributedSampler(drop_last=False) on {s['num_replicas']} ranks over {n} samples: "
                f"total_size {total}, {total // s['num_replicas']} per rank, so {pad} sample(s) "
                "drawn twice in every pass (torch/utils/data/distributed.py:116-120)",
                f"{len(evals)} evaluation pass(es) on rank {min(per_rank)}: run to their end with "
                "no backward() and no optimizer step while the DataLoader was iterated, the "
                "ranks' results then combined (all_reduce, all_gather, ...) before training went on",
                f"the DataLoader: {loader['line']}"]
    if seen:
        evidence.insert(1, "drawn on more than one rank: index " + ", ".join(map(str, seen[:6])))
    return Finding(
        "warning", "eval-sampler-pads", "07",
        f"an evaluation pass counts {pad} sample(s) twice: DistributedSampler pads {n} samples "
        f"to {total} so that every rank gets the same count", evidence=evidence,
        where=s["line"] or loader["line"],
        fix="evaluate every sample once: give each rank an unpadded share (Subset(val_set, "
            "range(rank, len(val_set), world_size)), or a sampler without padding) and "
            "all_reduce the sums and the counts, not the per-rank means; or "
            "DistributedSampler(val_set, shuffle=False, drop_last=True) and the remaining "
            "len(val_set) % world_size samples evaluated on one rank")
