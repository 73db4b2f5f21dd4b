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

Across the run (_samples_runs.py), from each epoch's first HEAD indices in order, the backward()
calls made while it was iterated and the ranks' results combined after it:
- epoch-order-replayed: a training epoch replays an earlier one's shuffled order on the same
  data, whichever DataLoader or sampler drew them (a resume that starts the sampler at epoch 0).
- eval-sampler-pads: an evaluation pass over a padding DistributedSampler whose results are
  combined across ranks: the repeats count in the metric.

Whatever the data source (_samples_rows.py on the ranks, _samples_overlap.py in the parent): a
hash of each row of the first tensor a data-parallel model's forward takes in training mode, per
DataLoader epoch or step:
- rows-on-several-ranks: replicas that train on the same rows (an IterableDataset split by worker
  but not by rank, a hand-made shard that forgot the rank). An IterableDataset's indices are not
  checked (its __iter__ reads its own samples), its rows are."""
from __future__ import annotations

import hashlib
import operator
import sys

from ._samples_data import (describe_dataset, describe_sampler, mapper, real_sampler,
                            decode, encode)  # noqa: F401 - decode: the tests' reader
from . import _samples_judge, _samples_overlap, _samples_runs
from ._samples_judge import KEY, REFUSED
from ._samples_rows import Rows, split_line
from ._samples_wraps import count_reductions, mark_line, wrap_init
from .api import Check
from ..userline import describe

SETS_KEPT = 4  # epochs per DataLoader line whose index sets are recorded (the others: counts and order)
MAX_DRAWS = 1 << 22  # indices recorded per epoch; a longer epoch is cut (never judged complete)
HEAD = 64  # the first indices of each epoch, in order: an epoch that replays another's order


def attach(ctx) -> None:
    import torch
    from torch.utils.data import (DataLoader, RandomSampler, Subset, SubsetRandomSampler,
                                  WeightedRandomSampler, dataloader)
    from torch.utils.data.distributed import DistributedSampler

    base = dataloader._BaseDataLoaderIter
    if getattr(base, "_ddp_lab_samples", False):
        return  # attached once per process: a second set of wrappers would count every draw twice
    base._ddp_lab_samples = True
    rec = _Recorder(ctx)
    wrap_init(DataLoader, ctx, rec.loader_made, refused=rec.refused)
    for sampler in (DistributedSampler, RandomSampler, WeightedRandomSampler, SubsetRandomSampler):
        wrap_init(sampler, ctx, mark_line)  # the line a sampler was built at (DataLoader's own: its line)
    wrap_init(Subset, ctx, mark_line)
    init, reset, next_index, next_ = base.__init__, base._reset, base._next_index, base.__next__

    def it_init(self, loader, *args, **kwargs):
        ctx.guard(rec.epoch_begins)(self, loader, sys._getframe(1))
        init(self, loader, *args, **kwargs)

    def it_reset(self, loader, *args, **kwargs):
        ctx.guard(rec.epoch_begins)(self, loader, sys._getframe(1), True)
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
                epoch["end"], epoch["bw"], epoch["last"] = ctx.step, rec.backwards, rec.seq
                rec.current = epoch

    base.__init__, base._reset, base._next_index, base.__next__ = (
        it_init, it_reset, it_next_index, it_next)
    ctx.on_torch_function([torch.Tensor.backward, torch.autograd.backward], rec.backward)
    count_reductions(rec)
    rows = Rows(ctx, rec)
    ctx.on_model(rows.model)
    ctx.on_finish(rec.emit)
    ctx.on_finish(rows.emit)


class _Recorder:
    """One rank's loaders and epochs; plain data at the end (`emit`)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.loaders: list[dict] = []
        self.kept: dict[str, int] = {}  # DataLoader line -> epochs begun (the first keep sets)
        self.current = None  # the epoch whose iterator yielded last (what the model trains on)
        self.backwards = 0  # backward() calls so far: an epoch without one is an evaluation
        self.seq = 0  # epochs begun on this rank, every DataLoader's: the run's order
        self.reductions = 0  # results combined across ranks so far (REDUCING's calls)
        self.pending: list[dict] = []  # epochs run to their end, training not resumed since

    def backward(self, func, args, kwargs, result) -> None:
        self.backwards += 1
        for epoch in self.pending:  # what was combined between the epoch's start and now
            epoch["red1"] = self.reductions
        self.pending = []

    def refused(self, line: str, exc: Exception) -> None:
        self.ctx.add(REFUSED, {"line": line, "type": type(exc).__name__, "message": str(exc)[:300]})

    def loader_made(self, loader, line: str) -> None:
        if getattr(loader, "_ddp_lab_samples", None) is not None:
            return  # a DataLoader subclass's __init__ ran ours already
        rec = {"line": line, "dataset": describe_dataset(loader.dataset),
               "sampler": describe_sampler(loader), "epochs": []}
        if rec["dataset"]["iterable"]:
            rec["dataset"]["split_line"] = split_line(self.ctx, loader.dataset)
        rec["mapper"] = mapper(loader.dataset)
        object.__setattr__(loader, "_ddp_lab_samples", rec)
        self.loaders.append(rec)

    def epoch_begins(self, it, loader, frame, reset: bool = False) -> None:
        rec = getattr(loader, "_ddp_lab_samples", None)
        if rec is None:
            return
        current = getattr(it, "_ddp_lab_epoch", None)
        if reset and current is not None and not current["n"] and not current["complete"]:
            return  # the multi-process iterator's first _reset, from its own __init__
        kept = self.kept[rec["line"]] = self.kept.get(rec["line"], 0) + 1
        began = self.ctx.files.loop_start(frame)
        epoch = {"line": self.ctx.user_line(frame), "began": describe(*began) if began else "",
                 "start": self.ctx.step, "end": self.ctx.step, "n": 0, "k": kept - 1,
                 "seq": self.seq, "head": [], "bw0": self.backwards, "bw": self.backwards,
                 "red0": self.reductions, "red1": None, "last": self.seq + 1,
                 "draws": [] if kept <= SETS_KEPT else None, "order": hashlib.sha1(),
                 "complete": False, "cut": False, "unindexed": False,
                 "sampler_epoch": getattr(real_sampler(loader), "epoch", None), "rec": rec}
        self.seq += 1
        rec["epochs"].append(epoch)
        it._ddp_lab_epoch = epoch

    def exhausted(self, it) -> None:
        epoch = getattr(it, "_ddp_lab_epoch", None)
        if epoch is not None:
            epoch["complete"] = not epoch["cut"]
            epoch["end"] = self.ctx.step
            self.pending.append(epoch)

    def emit(self, ctx) -> None:
        out = []
        for rec in self.loaders:
            epochs = [_epoch_record(e, rec["dataset"].get("len"), self.reductions)
                      for e in rec["epochs"]]
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
    if len(epoch["head"]) < HEAD:
        epoch["head"] += mapped[:HEAD - len(epoch["head"])]
    epoch["order"].update(repr(mapped).encode())
    if epoch["draws"] is not None:
        epoch["draws"] += mapped
        if len(epoch["draws"]) > MAX_DRAWS:
            epoch["draws"], epoch["cut"] = None, True


def _epoch_record(e: dict, n, reductions: int) -> dict:
    """An epoch as plain data: its count, a digest of its order, and (for the first epochs of a
    DataLoader line) the set of indices drawn."""
    out = {k: e[k] for k in ("line", "began", "start", "end", "complete", "unindexed",
                             "sampler_epoch", "n", "k", "seq", "last", "head")}
    out["backwards"] = e["bw"] - e["bw0"]  # backward() calls while it was iterated
    # results combined across ranks from its start until training resumed (or the run ended)
    out["reduced"] = (e["red1"] if e["red1"] is not None else reductions) - e["red0"]
    out["order"] = e["order"].hexdigest()[:16]
    if e["draws"] is not None and n and not e["unindexed"]:
        out["set"] = encode(e["draws"], n)
    return out


# --- the parent's side: _samples_judge.py (indices per epoch), _samples_runs.py (orders over the
# run, evaluation passes), _samples_overlap.py (the rows the model trains on) ------------------

def judge(ev) -> list:
    return (_samples_judge.judge(ev) + _samples_runs.replays(ev) + _samples_runs.eval_padding(ev)
            + _samples_overlap.judge(ev))


CHECK = Check(
    name="samples",
    mechanism="which samples each rank trains on, per epoch and across the run (DataLoader "
              "indices; a hash of each row the model's forward trains on)",
    lesson="07",
    codes={"sample-on-several-ranks": "warning", "sample-on-no-rank": "warning",
           "sampler-epoch-not-set": "warning", "dataloader-refused": "error",
           "epoch-order-replayed": "warning", "eval-sampler-pads": "warning",
           "rows-on-several-ranks": "warning", "samples-not-checked": "info"},
    attach=attach, judge=judge, tools=("watch",),
    tests=("tests/doctor/checks/test_samples.py", "tests/doctor/checks/test_samples_runs.py"),
    notes=("an IterableDataset's indices are not read (its __iter__ shards itself): the rows the "
           "model trains on are compared instead (the first input tensor, per DataLoader epoch)",
           "a dataset whose contents differ per rank (rank-local files) is not compared by index",
           "rows: a model wrapped in DDP or fully_shard only; a row of one value, inputs with few "
           "distinct rows, and a batch transformed differently per rank (augmentation) are not "
           "told apart; synthetic inputs made the same on every rank are a note, not a warning",
           "a replayed order: shuffling samplers only, compared on the first 64 indices of each "
           "epoch; a script that trains twice from scratch on purpose with one seed is warned too",
           "padded evaluation: a metric that drops the repeats by sample index is not seen"))
