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

import functools
import hashlib
import operator

from ._samples_data import (describe_dataset, describe_sampler, mapper, real_sampler,
                            decode, encode)  # noqa: F401 - decode: the tests' reader
from ._samples_judge import KEY, REFUSED, judge
from .api import Check

SETS_KEPT = 4  # epochs per DataLoader line whose index sets are recorded (the others: counts and order)
MAX_DRAWS = 1 << 22  # indices recorded per epoch; a longer epoch is cut (never judged complete)


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
        rec = {"line": line, "dataset": describe_dataset(loader.dataset),
               "sampler": describe_sampler(loader), "epochs": []}
        rec["mapper"] = mapper(loader.dataset)
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
                 "sampler_epoch": getattr(real_sampler(loader), "epoch", None), "rec": rec}
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


# --- the parent's side: _samples_judge.py --------------------------------------------------------


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
