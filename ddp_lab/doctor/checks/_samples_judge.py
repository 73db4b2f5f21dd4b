"""The samples check's judge (samples.py records on the ranks): the ranks' k-th training epochs
compared per DataLoader line and dataset; the user's line and the cause (the sampler, the
shards, the seed, the epoch) where they overlap or leave samples out."""
from __future__ import annotations

from collections import Counter

from ._samples_data import MAX_LEN, decode
from .api import Finding

KEY, REFUSED = "samples", "samples-refused"


def judge(ev) -> list[Finding]:
    out = _judge_refused(ev)
    streams = _streams(ev)
    world = len(ev.ranks)
    ddp = any(m.get("kind") == "ddp" for r in ev.ranks for m in r.get("models") or [])
    for key, per_rank in streams.items():
        first = next(iter(per_rank.values()))["loader"]
        ran = [e for s in per_rank.values() for e in s["epochs"] if training(e)]
        if first["dataset"].get("iterable"):
            if ran:
                out.append(_note(first, "reads an IterableDataset: the dataset's own __iter__ "
                                 "decides what each rank reads; its indices are not checked, the "
                                 "rows the model trains on from it are"))
            continue
        if ran and all(e["unindexed"] for e in ran):
            out.append(_note(first, "draws keys that are not integer positions: not checked"))
            continue
        if len(per_rank) < world:
            if any(k[0] == key[0] and k != key for k in streams):
                out.append(_note(first, "holds different data on different ranks (its contents "
                                 "differ): its indices are not compared across ranks"))
            continue
        if not first["dataset"].get("len"):
            out.append(_note(first, f"reads a dataset without a length or longer than {MAX_LEN} "
                                    "samples: not checked"))
            continue
        out += _judge_stream(per_rank, _elsewhere(streams, key), ddp)
        out += _judge_epochs(per_rank)
    return out


def _streams(ev) -> dict:
    """(DataLoader line, dataset kind, contents) -> {rank: {"loader", "epochs"}}: the loaders a
    rank made at one line on one dataset, their epochs in order (a loader made each epoch too)."""
    streams: dict = {}
    for r, rank in enumerate(ev.ranks):
        for loader in rank.get(KEY) or []:
            d = loader["dataset"]
            key = (loader["line"], d.get("type"), d.get("fingerprint"), d.get("len"))
            slot = streams.setdefault(key, {}).setdefault(r, {"loader": loader, "epochs": []})
            slot["epochs"] += loader["epochs"]
    return streams


def training(e) -> bool:
    """An epoch during which an optimizer step ended or backward() ran (not an evaluation pass,
    not a peek): a step is counted by the first optimizer that stepped, so a run that builds a
    new optimizer (a resume in the same process) trains on without steps ending."""
    return e["end"] > e["start"] or bool(e.get("backwards"))


def _trained(epochs) -> list:
    """The training epochs with indices drawn."""
    return [e for e in epochs if training(e) and e["n"] and not e["unindexed"]]


def _elsewhere(streams, key) -> set:
    """Indices of the same dataset drawn by the script's other loaders (a validation split)."""
    out = set()
    for other, per_rank in streams.items():
        if other != key and other[1:] == key[1:]:
            for s in per_rank.values():
                out.update(*(decode(e["set"]) for e in s["epochs"] if e.get("set")))
    return out


def _replicas(per_rank, ddp: bool) -> dict:
    """rank -> its epochs, one rank per data-parallel replica: without DDP (which makes every rank
    a replica), ranks whose DistributedSampler has num_replicas below the world size and the same
    rank= read one share by design (tensor or pipeline parallel ranks of one replica)."""
    samplers = {r: s["loader"]["sampler"] for r, s in per_rank.items()}
    if not ddp and all(s["distributed"] and s["num_replicas"] < len(per_rank) for s in samplers.values()):
        chosen = {}
        for r in sorted(per_rank):
            chosen.setdefault(samplers[r]["rank"], r)
        return {r: per_rank[r] for r in chosen.values()}
    return per_rank


def _judge_stream(per_rank, elsewhere, ddp: bool) -> list[Finding]:
    reps = _replicas(per_rank, ddp)
    ranks = sorted(reps)
    trained = {r: _trained(reps[r]["epochs"]) for r in ranks}
    count = min(len(t) for t in trained.values())
    if len(ranks) < 2 or count == 0:
        return []
    several, missing, n_several, lost_each, n_complete = None, None, 0, [], 0
    for k in range(count):
        eps = [trained[r][k] for r in ranks]
        if any("set" not in e for e in eps):
            break
        sets = [decode(e["set"]) for e in eps]
        shared = sorted(i for i, c in Counter(i for s in sets for i in s).items() if c > 1)
        n_several += bool(shared)
        if shared and several is None:
            several = (k, shared, eps, sets)
        if all(e["complete"] for e in eps):
            n_complete += 1
            lost = _domain(reps, ranks) - set().union(*sets) - elsewhere
            if lost:
                lost_each.append(lost)
                missing = missing or (k, sorted(lost), eps)
    out = []
    if several:
        out.append(_several(reps, ranks, several, n_several, count))
    if missing:
        out.append(_missing(reps, ranks, missing, lost_each, n_complete))
    return out


def _domain(reps, ranks) -> set:
    """What one epoch should cover: the outermost Subset the ranks share (a train split), else
    the whole dataset (the ranks' own Subsets are their shards)."""
    layers = [reps[r]["loader"]["dataset"].get("layers") or [] for r in ranks]
    for j in range(min(len(x) for x in layers)):
        sets = {x[j]["set"] for x in layers}
        if len(sets) == 1 and None not in sets:
            return decode(sets.pop())
    return set(range(reps[ranks[0]]["loader"]["dataset"]["len"]))


FIXES = {
    "shards": "build the ranks' shards so that together they cover the dataset, each sample once: "
              "Subset(dataset, range(rank, len(dataset), world_size)), or one DistributedSampler "
              "over the whole dataset; a slice of len(dataset) // world_size per rank drops the "
              "tail, and a shuffle each rank makes on its own before slicing overlaps",
    "none": "give the DataLoader a DistributedSampler(dataset) (each rank a disjoint share of one "
            "permutation) and call sampler.set_epoch(epoch) each epoch; DataLoader(shuffle=True) "
            "alone draws the whole dataset on every rank",
    "own": "shard this sampler's draws by rank (a DistributedSampler; for weights, each rank "
           "taking its share of one draw), or at least give it a generator seeded per rank "
           "(generator=torch.Generator().manual_seed(seed + rank)): seeded alike, every rank "
           "draws alike",
    "seed": "pass DistributedSampler the same seed on every rank: each rank takes its share of one "
            "permutation seeded with seed + epoch (torch/utils/data/distributed.py:111, 134); keep "
            "per-rank seeds for augmentation",
    "epoch": "call sampler.set_epoch(epoch) with the same epoch on every rank",
    "layout": "leave num_replicas and rank out of DistributedSampler (it reads them from the "
              "process group) or pass dist.get_world_size() and dist.get_rank()",
    "": "compare how each rank builds its dataset and sampler: one DistributedSampler(dataset) with "
        "the same seed and epoch on every rank gives disjoint shares that cover the dataset",
}


def _causes(reps, ranks, eps) -> tuple[list[str], str, str]:
    """What the ranks' samplers and datasets say about why; the user's line at fault; the fix."""
    loaders = [reps[r]["loader"] for r in ranks]
    samp = [x["sampler"] for x in loaders]
    outer = [(x["dataset"].get("layers") or [None])[0] for x in loaders]
    if all(outer) and len({o["set"] for o in outer}) > 1:
        return ["each rank builds its own Subset of the dataset (a shard per rank): their union "
                "is what the ranks can train on"], outer[0]["line"], FIXES["shards"]
    if not any(s["distributed"] for s in samp):
        own = samp[0]["line"] not in ("", loaders[0]["line"])  # the script built it, not DataLoader
        return [f"the sampler is {samp[0]['type']} on every rank, which knows nothing of the ranks: "
                f"each rank draws from the whole dataset ({samp[0]['len']} samples per epoch)"], \
            samp[0]["line"] if own else loaders[0]["line"], FIXES["own" if own else "none"]
    why, kind = [], ""
    values = {"seed": [s.get("seed") for s in samp], "epoch": [e["sampler_epoch"] for e in eps],
              "num_replicas": [s.get("num_replicas") for s in samp],
              "rank": [s.get("rank") for s in samp]}
    for name in ("seed", "epoch", "num_replicas"):
        if len(set(values[name])) > 1:
            why.append(f"DistributedSampler {name} differs per rank: " +
                       ", ".join(f"rank {r} {name}={v}" for r, v in zip(ranks, values[name])))
            kind = kind or ("layout" if name == "num_replicas" else name)
    if any(v != len(ranks) for v in values["num_replicas"]) or \
            len(set(values["rank"])) < len(ranks):
        why.append(f"DistributedSampler num_replicas={values['num_replicas'][0]} on {len(ranks)} "
                   "ranks; rank= " + ", ".join(f"{v} on rank {r}" for r, v in zip(ranks, values["rank"])))
        kind = kind or "layout"
    line = samp[0]["line"] if why and samp[0]["line"] else loaders[0]["line"]
    return why, line, FIXES[kind]


def _several(reps, ranks, found, n_epochs: int, count: int) -> Finding:
    k, shared, eps, sets = found
    samp = [reps[r]["loader"]["sampler"] for r in ranks]
    union = set().union(*sets)
    evidence = [f"training epoch {k}: {len(shared)} of the {len(union)} samples drawn were drawn on "
                f"more than one rank (indices {', '.join(map(str, shared[:6]))}"
                f"{', ...' if len(shared) > 6 else ''})",
                f"{n_epochs} of {count} training epoch(s) compared show it; per rank: " +
                ", ".join(f"rank {r} drew {e['n']}" for r, e in zip(ranks, eps))]
    identical = len({e["order"] for e in eps}) == 1
    if identical:
        evidence.append("every rank drew the same samples in the same order")
    why, where, fix = _causes(reps, ranks, eps)
    padding = samp[0].get("total_size", 0) - samp[0].get("dataset_len", 0)
    by_design = (all(s["distributed"] and not s["sampler_drop_last"] for s in samp) and not why
                 and len({e["sampler_epoch"] for e in eps}) == 1 and len(shared) <= padding)
    replacement = not identical and any(s["replacement"] for s in samp)
    if by_design or replacement:
        reason = (f"DistributedSampler(drop_last=False) repeats {padding} sample(s) to give every "
                  "rank the same count (torch/utils/data/distributed.py:116-120): by design"
                  if by_design else "the sampler draws with replacement: repeats are by design")
        return Finding("info", "sample-on-several-ranks", "07",
                       f"{len(shared)} sample(s) on more than one rank: {reason}",
                       evidence=evidence, where=reps[ranks[0]]["loader"]["line"])
    return Finding("warning", "sample-on-several-ranks", "07",
                   f"the same samples are trained on several ranks in one epoch ({len(shared)} of "
                   f"{len(union)})", evidence=evidence + why, where=where, fix=fix)


def _missing(reps, ranks, found, lost_each, n_complete: int) -> Finding:
    k, lost, eps = found
    samp = [reps[r]["loader"]["sampler"] for r in ranks]
    allowed, reasons = 0, []
    if all(s["distributed"] and s["sampler_drop_last"] for s in samp):
        allowed += samp[0]["dataset_len"] - samp[0]["total_size"]
        reasons.append("DistributedSampler(drop_last=True) drops the tail that does not divide "
                       "evenly (torch/utils/data/distributed.py:94-103, 127)")
    if any(s["replacement"] for s in samp):
        allowed = len(lost)
        reasons.append("the sampler draws with replacement: some samples are not drawn")
    if all(s["drop_last"] and s["batch_size"] for s in samp):
        allowed += sum((s["len"] or 0) % s["batch_size"] for s in samp)
        reasons.append("DataLoader(drop_last=True) drops each rank's last incomplete batch")
    evidence = [f"training epoch {k}, run to its end on every rank: {len(lost)} sample(s) drawn by "
                f"no rank (indices {', '.join(map(str, lost[:6]))}{', ...' if len(lost) > 6 else ''})",
                f"{len(lost_each)} of {n_complete} complete training epoch(s) show it" +
                (": the same samples each time, never trained" if len(lost_each) > 1 and
                 all(x == lost_each[0] for x in lost_each) else ""),
                "per rank: " + ", ".join(f"rank {r} drew {e['n']}" for r, e in zip(ranks, eps))]
    if len(lost) <= allowed:
        return Finding("info", "sample-on-no-rank", "07",
                       f"{len(lost)} sample(s) on no rank in an epoch: {'; '.join(reasons)}, by design",
                       evidence=evidence, where=reps[ranks[0]]["loader"]["line"])
    why, where, fix = _causes(reps, ranks, eps)
    return Finding("warning", "sample-on-no-rank", "07",
                   f"samples no rank trains on: {len(lost)} in one epoch", evidence=evidence + why,
                   where=where, fix=fix)


def _judge_epochs(per_rank) -> list[Finding]:
    """sampler-epoch-not-set: a shuffling DistributedSampler whose epoch never changed."""
    for r in sorted(per_rank):
        loader = per_rank[r]["loader"]
        s = loader["sampler"]
        if not (s["distributed"] and s["shuffle"]):
            continue
        eps = _trained(per_rank[r]["epochs"])
        for a, b in zip(eps, eps[1:]):
            if a["sampler_epoch"] == b["sampler_epoch"] and a["order"] == b["order"]:
                return [Finding(
                    "warning", "sampler-epoch-not-set", "07",
                    "DistributedSampler.set_epoch is never called: every epoch replays the same order",
                    evidence=[f"rank {r}: {len(eps)} training epochs; consecutive epochs drew the same "
                              f"{a['n']} samples in the same order (sampler epoch stayed {a['sampler_epoch']})",
                              f"the sampler: {s['line']}", f"the DataLoader: {loader['line']}"],
                    where=b["line"] or loader["line"],
                    fix="call sampler.set_epoch(epoch) at the start of each epoch, before the loop "
                        "iterates the DataLoader: the sampler seeds its shuffle with seed + epoch "
                        "(torch/utils/data/distributed.py:111)")]
    return []


def _judge_refused(ev) -> list[Finding]:
    found: dict = {}
    for r, rank in enumerate(ev.ranks):
        for item in rank.get(REFUSED) or []:
            found.setdefault((item["line"], item["type"], item["message"]), []).append(r)
    out = []
    for (line, kind, message), ranks in found.items():
        fix = ("a sampler decides the order, so DataLoader refuses shuffle=True beside it "
               "(torch/utils/data/dataloader.py:375): pass shuffle=(sampler is None); a "
               "DistributedSampler shuffles itself (shuffle=True by default)"
               if "mutually exclusive with shuffle" in message else
               "DataLoader's arguments conflict: read PyTorch's message")
        out.append(Finding("error", "dataloader-refused", "07",
                           f"DataLoader refused its arguments: {kind}: {message}",
                           evidence=[f"rank{'s' if len(ranks) > 1 else ''} "
                                     f"{', '.join(map(str, ranks))}: {kind}: {message}",
                                     "raised by DataLoader.__init__ (torch/utils/data/dataloader.py)"],
                           fix=fix, where=line))
    return out


def _note(loader, what: str) -> Finding:
    return Finding("info", "samples-not-checked", "07", f"The DataLoader at this line {what}",
                   where=loader["line"])
