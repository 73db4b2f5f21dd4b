"""The samples check's judge of the row fingerprints (_samples_rows.py records them): replicas of
one data-parallel group that train on the same input rows in one segment (a DataLoader epoch, or
a step) train on the same samples twice.

The rule, and what it leaves alone:
- A DataLoader over a map-style dataset is judged by its indices (_samples_judge.py), which know
  the sampler's padding and dropped tail: its rows are not judged again.
- A segment counts only where each rank's rows are distinct (at least 90 % of them): inputs with
  few distinct rows (constant features, a small vocabulary, one prompt repeated) do not tell
  samples apart.
- Up to world size - 1 repeats per DataLoader epoch are a sampler's padding (distributed.py:116).
- The rows shared by two ranks must be at least half of the rows compared, over every segment
  compared: independent draws that coincide now and then stay far below.
- Samples are a data set's: what a DataLoader yields, batches cut from a tensor (a slice of a
  larger one), or rows a rank meets again at a later step (a second pass). Inputs made afresh
  every step the same on every rank (synthetic data from one seed, as pytorch/examples' FSDP2
  script makes them) and one fixed batch trained on at every step are no data set to share: the
  same rows on every rank are then said as a note (the ranks compute one batch W times), not a
  warning."""
from __future__ import annotations

from collections import Counter

from ._samples_judge import KEY as LOADERS
from ._samples_rows import KEY
from .api import Finding

DISTINCT = 0.9
SHARED = 0.5


def judge(ev) -> list[Finding]:
    judged, loaders = _indexed_loaders(ev)
    by_tag: dict = {}
    forward = ""
    for r, rank in enumerate(ev.ranks):
        rec = rank.get(KEY) or {}
        forward = forward or rec.get("line") or ""
        for seg in rec.get("segments") or []:
            key = (tuple(seg["group"]), seg.get("model", ""), tuple(seg["tag"]))
            by_tag.setdefault(key, {})[r] = seg
    groups: dict = {}
    for (group, model, tag), segs in sorted(by_tag.items(), key=lambda kv: min(s["step"] for s in kv[1].values())):
        if len(segs) < 2 or tag[1] in judged:
            continue
        found = _compare(segs)
        if found is None:
            continue
        g = groups.setdefault((group, model, tag[0]), {"compared": 0, "shared": 0, "allowed": 0,
                                                "segments": 0, "first": None, "segs": []})
        g["compared"] += found["compared"]
        g["shared"] += found["shared"]
        g["allowed"] += len(segs) - 1 if tag[0] == "epoch" else 0
        g["segments"] += 1
        g["segs"].append(segs)
        if found["shared"] and g["first"] is None:
            g["first"] = (tag, found)
    out = []
    for (group, _, kind), g in groups.items():
        if g["shared"] > g["allowed"] and g["shared"] >= SHARED * g["compared"]:
            data = kind == "epoch" or _a_data_set(g["segs"])
            out.append(_finding(group, g, loaders, forward, data))
    return out


def _indexed_loaders(ev) -> tuple[set, dict]:
    """DataLoader lines over a map-style dataset with integer indices (the index route judges
    them), and every DataLoader line's record."""
    judged, loaders = set(), {}
    for rank in ev.ranks:
        for loader in rank.get(LOADERS) or []:
            loaders.setdefault(loader["line"], loader)
            indexed = any(not e["unindexed"] and e["n"] for e in loader["epochs"])
            if not loader["dataset"].get("iterable") and indexed:
                judged.add(loader["line"])
    return judged, loaders


def _compare(segs: dict) -> dict | None:
    sets = {}
    for r, seg in segs.items():
        rows = seg["rows"]
        if not rows or len(set(rows)) < DISTINCT * len(rows):
            return None  # rows that repeat within one rank are not one sample each
        sets[r] = set(rows)
    counts = Counter(h for s in sets.values() for h in s)
    shared = sum(1 for c in counts.values() if c > 1)
    same_order = len({tuple(s["rows"]) for s in segs.values()}) == 1
    return {"compared": min(len(s) for s in sets.values()), "shared": shared,
            "ranks": sorted(sets), "same_order": same_order}


def _a_data_set(step_segs: list) -> bool:
    """Steps' rows that are a data set's: a slice of a larger tensor, or rows a rank meets again
    at a later step, unless every step trains on one fixed batch."""
    per_rank: dict = {}
    for segs in step_segs:
        for r, seg in segs.items():
            per_rank.setdefault(r, []).append(seg)
    for segs in per_rank.values():
        sets = [frozenset(s["rows"]) for s in segs]
        if len(sets) > 1 and len(set(sets)) == 1:
            return False  # one batch, every step
        if any(s["view"] for s in segs) or sum(map(len, sets)) > len(frozenset().union(*sets)):
            return True
    return False


def _finding(group, g, loaders, forward_line: str, data: bool) -> Finding:
    tag, first = g["first"]
    loader = loaders.get(tag[1]) if tag[0] == "epoch" else None
    if loader is not None:
        what = f"DataLoader epoch {tag[2]} ({tag[1]})"
        split = loader["dataset"].get("split_line") or ""
        where = split or loader["line"]
        fix = FIX_ITERABLE if loader["dataset"].get("iterable") else FIX_ANY
    else:
        what, where, fix, split = f"step {tag[2]} (no DataLoader epoch)", forward_line, FIX_ANY, ""
    evidence = [f"{what}: ranks {', '.join(map(str, first['ranks']))} trained on {first['shared']} "
                f"of the same input rows (of {first['compared']} compared per rank)"
                + ("; every rank in the same order" if first["same_order"] else ""),
                f"over {g['segments']} {tag[0]}(s) compared: {g['shared']} of {g['compared']} rows "
                f"shared (ranks of one data-parallel group: {list(group)})",
                "a row is one sample of the first tensor the model's forward takes in training "
                "mode (hashed per row, on each rank)"]
    if loader is not None:
        evidence.append(f"the DataLoader: {loader['line']}; its dataset: {loader['dataset']['type']}"
                        + (f"; its split: {split}" if split else ""))
    if not data:
        return Finding("info", "rows-on-several-ranks", "07",
                       "every rank trains on the same inputs, made the same on every rank (one "
                       "seed, or one fixed batch): the ranks compute one batch W times; seed the "
                       "inputs with the rank for W different ones", evidence=evidence, where=where)
    return Finding("warning", "rows-on-several-ranks", "07",
                   f"the same inputs are trained on several ranks: {g['shared']} of {g['compared']} "
                   "rows on more than one rank", evidence=evidence, where=where, fix=fix)


FIX_ITERABLE = ("split the stream by rank as well as by DataLoader worker: in __iter__, start at "
                "rank * num_workers + worker id and step by world_size * num_workers (rank and "
                "world_size from torch.distributed, the worker from get_worker_info()); a Hugging "
                "Face stream: datasets.distributed.split_dataset_by_node(ds, rank, world_size)")
FIX_ANY = ("give each rank its own share of the data: a DistributedSampler over a map-style "
           "dataset, or a shard by rank (records[rank::world_size]) cut before the batches are")
