"""The reference check's rank side for the data (reference.py attaches it): which DataLoaders feed
the compared steps, the batch size each gives a rank and where that number comes from (a parsed
argument: `batch_size=args.batch_size`), and a hash of every row of each batch drawn. In the
one-process reference run (role "reference"), the same script is fed the global batch of each
step: the argument the batch size comes from is multiplied by the world size as the script parses
it (as a one-process user would pass `--batch-size 16` for 2 x 8), else the DataLoader is given
the global batch size; a loader that already takes it (a script that divides a global batch by
the world size) is left alone. The parent compares the rows: the reference's step k must hold
exactly the union of the ranks' step k (reference.py's judge), or nothing is compared.

Why the union holds: DistributedSampler shuffles the whole data set with one generator seeded
seed + epoch at every world size and rank r takes indices[r::N] (torch/utils/data/distributed.py:
110-134), so with N x B per batch at world 1, batch k is the ranks' k-th batches together
(padding at the epoch's end aside: the row hashes say so). A stream sharded by `i % world ==
rank` gives the same; data made per rank (torch.randn in the loop, a random augmentation) does
not, and is refused by the row comparison, never compared.
"""
from __future__ import annotations

import ast
import functools
import inspect
import zlib

from ._reference_lines import assigned, call_argument

ROWS_KEPT = 4096  # rows hashed per batch (a larger batch: its count only)
LOADERS = "reference.loaders"
BATCHES = "reference.batches"
SCALED = "reference.scaled"


class Data:
    """One rank's DataLoaders and batches for the compared steps (ctx.step < steps)."""

    def __init__(self, ctx, cfg: dict, shared: dict):
        self.ctx, self.cfg, self.shared = ctx, cfg, shared  # shared: the trace's (drawing, drawn)
        self.reference = cfg.get("role") == "reference"
        self.steps = int(cfg.get("steps", 3))
        plan = cfg.get("plan") or {}
        self.args = plan.get("args", {})  # dest -> factor (the reference)
        self.batches = {int(k): v for k, v in plan.get("loaders", {}).items()}  # index -> batch
        self.made = 0
        self.parsed: list = []  # (parser, namespace) the script parsed

    def attach(self) -> None:
        import argparse

        from torch.utils.data import DataLoader, dataloader

        ctx, data = self.ctx, self
        parse = argparse.ArgumentParser.parse_known_args

        @functools.wraps(parse)
        def parse_known_args(parser, *args, **kwargs):
            out = parse(parser, *args, **kwargs)
            ctx.guard(data.parsed_args)(parser, out[0] if isinstance(out, tuple) else out)
            return out

        init = DataLoader.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)  # inspect.signature(DataLoader) stays PyTorch's
        def loader_init(loader, *args, **kwargs):
            index = data.made
            data.made += 1
            if data.reference and index in data.batches:
                args, kwargs = ctx.guard(data.scale_loader)(signature, index, loader, args, kwargs) \
                    or (args, kwargs)
            init(loader, *args, **kwargs)
            ctx.guard(data.loader_made)(loader, index)

        iterate = DataLoader.__iter__

        @functools.wraps(iterate)
        def loader_iter(loader):
            it = iterate(loader)
            index = getattr(loader, "_ddp_lab_reference", None)
            if index is not None:
                try:
                    it._ddp_lab_reference = index
                except AttributeError:
                    pass
            return it

        base = dataloader._BaseDataLoaderIter
        next_ = base.__next__

        def it_next(it):
            data.shared["drawing"] = True
            try:
                batch = next_(it)
            finally:
                data.shared["drawing"] = False
            index = getattr(it, "_ddp_lab_reference", None)
            if index is not None and ctx.step < data.steps:
                ctx.guard(data.drawn)(index, batch)
            return batch

        argparse.ArgumentParser.parse_known_args = parse_known_args
        DataLoader.__init__, DataLoader.__iter__, base.__next__ = loader_init, loader_iter, it_next

    # --- the script's arguments ------------------------------------------------------------------
    def parsed_args(self, parser, namespace) -> None:
        self.parsed.append((parser, namespace))
        for dest, factor in self.args.items():
            value = getattr(namespace, dest, None)
            if isinstance(value, int) and not isinstance(value, bool) and not getattr(
                    namespace, f"_ddp_lab_scaled_{dest}", False):
                setattr(namespace, dest, value * factor)
                object.__setattr__(namespace, f"_ddp_lab_scaled_{dest}", True)
                self.ctx.add(SCALED, {"dest": dest, "option": option_of(parser, dest),
                                      "from": value, "to": value * factor})

    # --- DataLoaders ------------------------------------------------------------------------------
    def scale_loader(self, signature, index: int, loader, args, kwargs):
        """The reference's loader `index` given the global batch when it does not take it already."""
        bound = signature.bind(loader, *args, **kwargs)
        given = bound.arguments.get("batch_size", 1)
        want = self.batches[index]
        rec = {"i": index, "from": given, "to": want, "line": self.ctx.user_line()}
        if given != want and given is not None and bound.arguments.get("batch_sampler") is None:
            bound.arguments["batch_size"] = want
            rec["patched"] = True
        self.ctx.add(SCALED, rec)
        return tuple(bound.args[1:]), dict(bound.kwargs)

    def loader_made(self, loader, index: int) -> None:
        from torch.utils.data import IterableDataset

        if getattr(loader, "_ddp_lab_reference", None) is not None:
            return  # a subclass's __init__ ran ours already
        object.__setattr__(loader, "_ddp_lab_reference", index)
        frame = user_frame(self.ctx)
        sampler = getattr(loader, "batch_sampler", None)
        custom = sampler is not None and type(sampler).__name__ != "BatchSampler"
        self.ctx.add(LOADERS, {
            "i": index, "line": self.ctx.user_line(frame), "batch": loader.batch_size,
            "custom_batches": custom, "drop_last": bool(getattr(loader, "drop_last", False)),
            "sampler": type(getattr(loader, "sampler", None)).__name__,
            "iterable": isinstance(loader.dataset, IterableDataset),
            "arg": batch_argument(frame, loader.batch_size, self.parsed) if frame else None})

    def drawn(self, index: int, batch) -> None:
        tensors = [t for t in _tensors(batch) if t.dim() > 0]
        if not tensors:
            return
        n = int(tensors[0].shape[0])
        same = [t for t in tensors if t.shape[0] == n]
        rec = {"s": self.ctx.step, "i": index, "n": n}
        self.shared["drawn"] = self.ctx.step
        if n <= ROWS_KEPT:
            rec["rows"] = row_hashes(same, n)
        self.ctx.add(BATCHES, rec)


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def row_hashes(tensors, n: int) -> list[str]:
    """A crc32 per row over every tensor's row (the same bytes: the same sample)."""
    import torch

    crcs = [0] * n
    for t in tensors:
        flat = t.detach().cpu().contiguous().reshape(n, -1)
        if flat.dtype == torch.bool:
            flat = flat.to(torch.uint8)
        raw = flat.view(torch.uint8).numpy() if flat.numel() else None
        if raw is None:
            continue
        for i in range(n):
            crcs[i] = zlib.crc32(raw[i].tobytes(), crcs[i])
    return [f"{c:08x}" for c in crcs]


def user_frame(ctx):
    """The innermost frame of the user's files on this stack (frames.ScriptFiles decides)."""
    import sys

    frame = sys._getframe(1)
    while frame is not None and not ctx.is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def option_of(parser, dest: str) -> str:
    """`--batch-size` for dest "batch_size" (the longest option string), or the dest."""
    for action in getattr(parser, "_actions", []):
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return dest


def batch_argument(frame, batch, parsed) -> dict | None:
    """Where the DataLoader's batch size comes from, when it is a parsed argument: the
    expression given as batch_size (`args.batch_size`, or a name assigned from one in the same
    function) read from the call's source; else a parsed argument named like a batch holding
    the same number, when exactly one does. None: a literal, arithmetic, anything else."""
    import argparse

    node = call_argument(frame, ("DataLoader", "Loader"), "batch_size", 1)
    dest = None
    if isinstance(node, ast.Name):
        node = assigned(frame, node.id) or node
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        holder = frame.f_locals.get(node.value.id, frame.f_globals.get(node.value.id))
        if isinstance(holder, argparse.Namespace):
            dest = node.attr
    guessed = False
    if dest is None and (node is None or isinstance(node, ast.Name)):
        found = {(id(ns), k) for _, ns in parsed for k, v in vars(ns).items()
                 if "batch" in k and v == batch and isinstance(v, int) and not isinstance(v, bool)}
        if len(found) == 1:
            dest, guessed = next(iter(found))[1], True
    if dest is None:
        return None
    parser = next((p for p, ns in parsed if hasattr(ns, dest)), None)
    return {"dest": dest, "option": option_of(parser, dest) if parser else dest,
            "value": batch, "guessed": guessed}
