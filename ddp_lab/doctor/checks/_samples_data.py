"""The samples check's description of a DataLoader on a rank (samples.py): its sampler, its
dataset (type, length, a fingerprint of its contents, the index sets of its Subsets), and index
sets as compact text (a bitmap, compressed) the parent decodes."""
from __future__ import annotations

import base64
import hashlib
import itertools
import operator
import zlib

MAX_LEN = 1 << 24  # datasets longer than this: not checked


def real_sampler(loader):
    """The sampler that orders the indices: a batch sampler's own when the user gave one."""
    inner = getattr(loader.batch_sampler, "sampler", None)
    return inner if inner is not None else loader.sampler


def describe_sampler(loader) -> dict:
    from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler
    from torch.utils.data.distributed import DistributedSampler

    s = real_sampler(loader)
    out = {"type": type(s).__name__, "line": getattr(s, "_ddp_lab_line", ""),
           "distributed": isinstance(s, DistributedSampler),
           "shuffles": isinstance(s, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler))
           or bool(isinstance(s, DistributedSampler) and s.shuffle),
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


def mapper(ds):
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


def describe_dataset(ds) -> dict:
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
        inner = mapper(layers[k + 1]) if k + 1 < len(layers) else None
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
