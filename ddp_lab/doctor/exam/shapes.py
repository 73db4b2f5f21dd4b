"""Inputs of other shapes on other ranks. A fixed example input is the same shape everywhere, so
a bug that shows only when ranks see different sequence lengths or image sizes (a cache or a
buffer sized from the input) would never show. Before any rank starts, `plan` tries, in this
process, one forward pass with a non-batch dimension cut shorter; the first dimension the module
accepts is varied between ranks: even ranks get the full length, odd ranks the shorter one."""
from __future__ import annotations

from ..batch import map_tensors, tensors_in
from .inputs import batch_for, forward_here

TRIES = 3  # forward passes spent looking for a dimension the module lets vary


def narrow(batch, plan: dict, rank: int):
    """Every tensor of `batch` whose size along plan["dim"] is plan["size"], cut to
    `plan["sizes"][rank % 2]` (the same cut for an input and its mask)."""
    dim, full, size = plan["dim"], plan["size"], plan["sizes"][rank % len(plan["sizes"])]

    def one(t):
        return t.narrow(dim, 0, size).clone() if t.dim() > dim and t.shape[dim] == full else t
    return map_tensors(batch, one)


def rank_batch(example, rank: int, plan: dict | None):
    batch = batch_for(example, rank)
    return narrow(batch, plan, rank) if plan and not callable(example) else batch


def _candidates(batch):
    """(dim, full length, shorter length) to try, sequence dimension (1) first."""
    shapes = [t.shape for t in tensors_in(batch)]
    first = max(shapes, key=len) if shapes else ()
    out = []
    for dim in range(1, len(first)):
        full = first[dim]
        for shorter in (full - 1, full // 2):
            if shorter >= 2 and shorter != full and (dim, full, shorter) not in out:
                out.append((dim, full, shorter))
    return out


def plan(model, example, amp: str | None) -> dict | None:
    """{"dim", "size", "sizes": [even ranks, odd ranks]} for a fixed example whose module takes
    another length along some non-batch dimension; None when it takes none (or the example is
    a function of the rank, whose shapes are the user's)."""
    if callable(example):
        return None
    for dim, full, shorter in _candidates(example)[:TRIES]:
        trial = {"dim": dim, "size": full, "sizes": [full, shorter]}
        try:
            forward_here(model, narrow(example, trial, 1), amp)
        except Exception:
            continue
        return trial
    return None


def describe(example, plan_: dict | None, world_size: int) -> str:
    if callable(example):
        return "input: your function rank -> batch (its shapes are the ones exercised)"
    shapes = [tuple(t.shape) for t in tensors_in(example)]
    if not plan_ or world_size < 2:
        return (f"input: every rank gets the same shape {', '.join(map(str, shapes))}, values "
                "perturbed per rank (the module took no other length along its non-batch "
                "dimensions)")
    dim, sizes = plan_["dim"], plan_["sizes"]
    return (f"input: ranks fed different lengths along dim {dim}: {sizes[0]} on rank 0, "
            f"{sizes[1]} on rank 1" + (" (even ranks / odd ranks)" if world_size > 2 else ""))
