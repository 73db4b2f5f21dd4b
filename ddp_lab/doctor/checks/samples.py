"""Watch check "samples": which samples each rank trains on, read where the DataLoader draws them.

Each rank records the dataset indices every DataLoader's iterator draws
(`_BaseDataLoaderIter._next_index`, torch/utils/data/dataloader.py:714, which every iterator,
single- or multi-process, calls for each batch's indices; a batch sampler gives a list), per epoch
(one iterator, or one `_reset` of a persistent one: dataloader.py:702, 1233) and per dataset (its
type, length and a fingerprint of its contents, so indices are compared only where the ranks hold
the same data). Indices into a `Subset` are mapped to its dataset's (dataset.py:435). The parent
compares the ranks' k-th training epoch (an epoch during which an optimizer step ended):

- sample-on-several-ranks: one index drawn on two ranks. DistributedSampler(drop_last=False)
  repeats up to num_replicas - 1 indices to make the count even (distributed.py:116-120): by design.
- sample-on-no-rank: every rank ran the epoch to its end and an index of the dataset was drawn by
  none. DistributedSampler(drop_last=True) drops len % num_replicas (distributed.py:94-103, 127)
  and DataLoader(drop_last=True) the last incomplete batch of each rank: by design.
- sampler-epoch-not-set: a shuffling DistributedSampler seeds its permutation with seed + epoch
  (distributed.py:111); without set_epoch every epoch replays the same order.
- dataloader-refused: DataLoader.__init__ raised (e.g. "sampler option is mutually exclusive with
  shuffle", dataloader.py:375).
An IterableDataset reads its own samples (its __iter__): not checked, said as a note."""
from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import operator
import zlib
from collections import Counter

from .api import Check, Finding

KEY, REFUSED = "samples", "samples-refused"
SETS_KEPT = 4  # epochs per DataLoader line whose index sets are recorded (the others: counts and order)
MAX_DRAWS = 1 << 22  # indices recorded per epoch; a longer epoch is cut (never judged complete)
MAX_LEN = 1 << 24  # datasets longer than this: not checked


def attach(ctx) -> None:
    from torch.utils.data import DataLoader, Subset, dataloader
    from torch.utils.data.distributed import DistributedSampler

    base = dataloader._BaseDataLoaderIter
    if getattr(base, "_ddp_lab_samples", False):
        return  # attached once per process: a second set of wrappers would count every draw twice
    base._ddp_lab_samples = True
    rec = _Recorder(ctx)
    _wrap_init(DataLoader, ctx, rec.loader_made, refused=rec.refused)
    _wrap_init(DistributedSampler, ctx, _mark_line)
    _wrap_init(Subset, ctx, _mark_line)
    init, reset, next_index, next_ = base.__init__, base._reset, base._next_index, base.__next__

    def it_init(self, loader, *args, **kwargs):
        ctx.guard(rec.epoch_begins)(self, loader, ctx.user_line())
        init(self, loader, *args, **kwargs)

    def it_reset(self, loader, *args, **kwargs):
        ctx.guard(rec.epoch_begins)(self, loader, ctx.user_line(), True)
        return reset(self, loader, *args, **kwargs)

    def it_next_index(self):
        try:
            index = next_index(self)
        except StopIteration:
            ctx.guard(rec.exhausted)(self)
            raise
        epoch = getattr(self, "_ddp_lab_epoch", None)
        if epoch is not None and not epoch["unindexed"]:
            if epoch["rec"]["mapper"] is None:  # plain ints, no Subset: no torch call, no guard
                try:
                    _drawn(epoch, index, None)
                except Exception:  # noqa: BLE001 - never into the user's loop
                    epoch["unindexed"] = True
            else:  # Subset indices may be a tensor: the guard hides those calls
                ctx.guard(_drawn)(epoch, index, epoch["rec"]["mapper"])
        return index

    def it_next(self):
        try:
            return next_(self)
        finally:
            epoch = getattr(self, "_ddp_lab_epoch", None)
            if epoch is not None:
                epoch["end"] = ctx.step

    base.__init__, base._reset, base._next_index, base.__next__ = (
        it_init, it_reset, it_next_index, it_next)
    ctx.on_finish(rec.emit)


def _wrap_init(cls, ctx, after, refused=None) -> None:
    original = cls.__init__

    @functools.wraps(original)  # inspect.signature(DataLoader) stays PyTorch's (Lightning reads it)
    def __init__(self, *args, **kwargs):
        line = ctx.user_line()
        try:
            original(self, *args, **kwargs)
        except Exception as exc:
            if refused is not None:
                ctx.guard(refused)(line, exc)
            raise
        ctx.guard(after)(self, line)

    cls.__init__ = __init__


def _mark_line(obj, line: str) -> None:
    if not getattr(obj, "_ddp_lab_line", ""):  # a subclass's __init__ calls ours: keep the first
        obj._ddp_lab_line = line


class _Recorder:
    """One rank's loaders and epochs; plain data at the end (`emit`)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.loaders: list[dict] = []
        self.kept: dict[str, int] = {}  # DataLoader line -> epochs begun (the first keep sets)

    def refused(self, line: str, exc: Exception) -> None:
        self.ctx.add(REFUSED, {"line": line, "type": type(exc).__name__, "message": str(exc)[:300]})

    def loader_made(self, loader, line: str) -> None:
        if getattr(loader, "_ddp_lab_samples", None) is not None:
            return  # a DataLoader subclass's __init__ ran ours already
        rec = {"line": line, "dataset": _describe_dataset(loader.dataset),
               "sampler": _describe_sampler(loader), "epochs": []}
        rec["mapper"] = _mapper(loader.dataset)
        object.__setattr__(loader, "_ddp_lab_samples", rec)
        self.loaders.append(rec)

    def epoch_begins(self, it, loader, line: str, reset: bool = False) -> None:
        rec = getattr(loader, "_ddp_lab_samples", None)
        if rec is None:
            return
        current = getattr(it, "_ddp_lab_epoch", None)
        if reset and current is not None and not current["n"] and not current["complete"]:
            return  # the multi-process iterator's first _reset, from its own __init__
        kept = self.kept[rec["line"]] = self.kept.get(rec["line"], 0) + 1
        epoch = {"line": line, "start": self.ctx.step, "end": self.ctx.step, "n": 0,
                 "draws": [] if kept <= SETS_KEPT else None, "order": hashlib.sha1(),
                 "complete": False, "cut": False, "unindexed": False,
                 "sampler_epoch": getattr(_real_sampler(loader), "epoch", None), "rec": rec}
        rec["epochs"].append(epoch)
        it._ddp_lab_epoch = epoch

    def exhausted(self, it) -> None:
        epoch = getattr(it, "_ddp_lab_epoch", None)
        if epoch is not None:
            epoch["complete"] = not epoch["cut"]
            epoch["end"] = self.ctx.step

    def emit(self, ctx) -> None:
        out = []
        for rec in self.loaders:
            epochs = [_epoch_record(e, rec["dataset"].get("len")) for e in rec["epochs"]]
            out.append({k: v for k, v in rec.items() if k not in ("mapper", "epochs")} |
                       {"epochs": epochs})
        ctx.emit(KEY, out)


def _drawn(epoch: dict, index, mapper) -> None:
    """One draw of the sampler (an index, or a batch sampler's list) into the epoch's record."""
    items = index if isinstance(index, (list, tuple)) else (index,)
    try:
        mapped = [operator.index(i) for i in items] if mapper is None else \
            [mapper(operator.index(i)) for i in items]
    except (TypeError, IndexError, ValueError):
        epoch["unindexed"] = True  # keys that are not positions (or an IterableDataset's None)
        return
    epoch["n"] += len(mapped)
    epoch["order"].update(repr(mapped).encode())
    if epoch["draws"] is not None:
        epoch["draws"] += mapped
        if len(epoch["draws"]) > MAX_DRAWS:
            epoch["draws"], epoch["cut"] = None, True


def _epoch_record(e: dict, n) -> dict:
    """An epoch as plain data: its count, a digest of its order, and (for the first epochs of a
    DataLoader line) the set of indices drawn."""
    out = {k: e[k] for k in ("line", "start", "end", "complete", "unindexed", "sampler_epoch", "n")}
    out["order"] = e["order"].hexdigest()[:16]
    if e["draws"] is not None and n and not e["unindexed"]:
        out["set"] = encode(e["draws"], n)
    return out


def _real_sampler(loader):
    """The sampler that orders the indices: a batch sampler's own when the user gave one."""
    inner = getattr(loader.batch_sampler, "sampler", None)
    return inner if inner is not None else loader.sampler


def _describe_sampler(loader) -> dict:
    from torch.utils.data import WeightedRandomSampler
    from torch.utils.data.distributed import DistributedSampler

    s = _real_sampler(loader)
    out = {"type": type(s).__name__, "line": getattr(s, "_ddp_lab_line", ""),
           "distributed": isinstance(s, DistributedSampler),
           "replacement": bool(getattr(s, "replacement", False)) or
           (isinstance(s, WeightedRandomSampler) and s.replacement),
           "batch_sampler": type(loader.batch_sampler).__name__,
           "batch_size": loader.batch_size, "drop_last": bool(loader.drop_last)}
    try:
        out["len"] = len(s)
    except TypeError:
        out["len"] = None
    if out["distributed"]:
        out.update(seed=s.seed, shuffle=bool(s.shuffle), sampler_drop_last=bool(s.drop_last),
                   num_replicas=s.num_replicas, rank=s.rank, total_size=s.total_size,
                   dataset_len=len(s.dataset))
    return out


def _subsets(ds) -> tuple[list, object]:
    from torch.utils.data import Subset

    layers = []
    while isinstance(ds, Subset) and len(layers) < 8:
        layers.append(ds)
        ds = ds.dataset
    return layers, ds


def _mapper(ds):
    """index into `ds` -> index into the dataset under its Subsets (None: no Subset)."""
    layers, _ = _subsets(ds)
    chain = [_plain(layer.indices) for layer in layers]
    if not chain:
        return None

    def mapped(i: int) -> int:
        for indices in chain:
            i = operator.index(indices[i])
        return i
    return mapped


def _plain(indices):
    """A Subset's indices as Python ints when they are a tensor or an array (one conversion, not
    a tensor indexing per draw)."""
    return indices.tolist() if hasattr(indices, "tolist") else indices


def _describe_dataset(ds) -> dict:
    from torch.utils.data import IterableDataset

    layers, base = _subsets(ds)
    out = {"type": type(base).__qualname__, "iterable": isinstance(base, IterableDataset)}
    if out["iterable"]:
        return out
    try:
        n = len(base)
    except TypeError:
        n = None
    out["len"] = n if n is not None and n <= MAX_LEN else None
    out["fingerprint"] = fingerprint(base)
    out["layers"] = []
    for k, layer in enumerate(layers if out["len"] else ()):  # outer first: base index sets
        inner = _mapper(layers[k + 1]) if k + 1 < len(layers) else None
        try:
            mapped = [operator.index(i) if inner is None else inner(operator.index(i))
                      for i in _plain(layer.indices)]
        except (TypeError, IndexError, ValueError):
            out["layers"].append({"line": getattr(layer, "_ddp_lab_line", ""), "set": None})
            continue
        out["layers"].append({"line": getattr(layer, "_ddp_lab_line", ""),
                              "set": encode(mapped, n) if n else None})
    return out


def fingerprint(ds, depth: int = 0) -> str:
    """A digest of what a dataset holds (its attributes' tensors, arrays, lists and scalars, a
    strided sample of the large ones): equal on ranks that hold the same data."""
    h = hashlib.sha1(type(ds).__qualname__.encode())
    for name, value in sorted(getattr(ds, "__dict__", {}).items()):
        if not name.startswith("_ddp_lab"):
            h.update(name.encode())
            _feed(h, value, depth)
    return h.hexdigest()[:16]


def _feed(h, v, depth: int) -> None:
    import torch

    if isinstance(v, torch.Tensor):
        h.update(repr((tuple(v.shape), str(v.dtype), _rows(v.detach()))).encode())
    elif type(v).__module__ == "numpy" and hasattr(v, "shape"):  # an ndarray (a memmap too)
        h.update(repr((tuple(v.shape), str(v.dtype), _rows(v))).encode())
    elif hasattr(v, "__array__") and hasattr(v, "shape"):  # frames, Arrow tables: no conversion
        h.update(repr((type(v).__qualname__, tuple(v.shape))).encode())
    elif isinstance(v, (str, bytes, int, float, bool, type(None))):
        h.update(repr(v).encode())
    elif isinstance(v, (list, tuple, range)) and depth < 3:
        h.update(f"{type(v).__name__}{len(v)}".encode())
        for item in (list(v[:64]) + list(v[-64:]) if len(v) > 128 else v):
            _feed(h, item, depth + 1)
    elif isinstance(v, dict) and depth < 3:
        h.update(f"dict{len(v)}".encode())
        for key in itertools.islice(v, 64):  # insertion order: the same where built the same
            h.update(repr(key).encode())
            _feed(h, v[key], depth + 1)
    elif hasattr(v, "__getitem__") and hasattr(v, "__len__") and depth < 3 and hasattr(v, "__dict__"):
        h.update(fingerprint(v, depth + 1).encode())  # a dataset inside (ConcatDataset's)
    else:
        h.update(type(v).__qualname__.encode())  # transforms, files, ...: their kind only


def _rows(a) -> list:
    """Up to 16 rows spread over a tensor or array, the first 256 values of each: a sample that
    costs the same for any size (no copy of the whole, contiguous or not)."""
    if not len(a.shape):
        return [a.tolist()]
    rows = a[::max(1, a.shape[0] // 16)][:16]
    return [row.reshape(-1)[:256].tolist() for row in rows]


def encode(indices, n: int) -> str:
    bits = bytearray((n + 7) // 8)
    for i in indices:
        if 0 <= i < n:
            bits[i >> 3] |= 1 << (i & 7)
    return base64.b64encode(zlib.compress(bytes(bits))).decode()


def decode(text: str) -> set[int]:
    out = set()
    for k, byte in enumerate(zlib.decompress(base64.b64decode(text))):
        if byte:
            out.update(8 * k + b for b in range(8) if byte >> b & 1)
    return out


# --- the parent's side ------------------------------------------------------------------------

def judge(ev) -> list[Finding]:
    out = _judge_refused(ev)
    streams = _streams(ev)
    world = len(ev.ranks)
    ddp = any(m.get("kind") == "ddp" for r in ev.ranks for m in r.get("models") or [])
    for key, per_rank in streams.items():
        first = next(iter(per_rank.values()))["loader"]
        ran = [e for s in per_rank.values() for e in s["epochs"] if e["end"] > e["start"]]
        if first["dataset"].get("iterable"):
            if ran:
                out.append(_note(first, "reads an IterableDataset: the dataset's own __iter__ "
                                 "decides what each rank reads; not checked"))
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


def _trained(epochs) -> list:
    """The epochs during which an optimizer step ended (not an evaluation pass, not a peek)."""
    return [e for e in epochs if e["end"] > e["start"] and e["n"] and not e["unindexed"]]


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
        return [f"the sampler is {samp[0]['type']} on every rank, which knows nothing of the ranks: "
                f"each rank draws from the whole dataset ({samp[0]['len']} samples per epoch)"], \
            loaders[0]["line"], FIXES["none"]
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


CHECK = Check(
    name="samples",
    mechanism="which samples each rank trains on, per epoch (DataLoader indices)",
    lesson="07",
    codes={"sample-on-several-ranks": "warning", "sample-on-no-rank": "warning",
           "sampler-epoch-not-set": "warning", "dataloader-refused": "error",
           "samples-not-checked": "info"},
    attach=attach, judge=judge, tools=("watch",),
    tests="tests/doctor/checks/test_samples.py",
    notes=("an IterableDataset shards itself (its __iter__): not checked",
           "a dataset whose contents differ per rank (rank-local files) is not compared"))
