"""How the ranks of a doctor run compare notes. These are collectives: every rank calls them, in
the same order. They run on a process group of their own, so that a module whose collectives
are out of step with the other ranks cannot pair them with the doctor's."""
from __future__ import annotations

import json

MARK = "@@ddp-lab-doctor "


def emit(key: str, value) -> None:
    """Write one record to this rank's stdout; the launcher brings it back, even from a rank that
    later fails or hangs."""
    print("\n" + MARK + json.dumps({"key": key, "value": value}), flush=True)


def records(stdout: str) -> dict:
    """The records a rank emitted, by key (the last one of each key wins)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(MARK):
            try:
                item = json.loads(line[len(MARK):])
            except ValueError:
                continue
            out[item["key"]] = item["value"]
    return out


def new_group():
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


def gather(obj, group) -> list:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def drift(named: dict, group) -> dict:
    """{name: max |this rank - rank 0|, the largest over ranks} for every tensor that has the
    same shape on every rank; names missing or shaped differently somewhere map to None."""
    import torch
    import torch.distributed as dist

    shapes = {n: list(t.shape) for n, t in named.items()}
    everyone = gather(shapes, group)
    common = sorted(n for n in shapes if all(s.get(n) == shapes[n] for s in everyone))
    result: dict = {n: None for n in set().union(*everyone) if n not in common}
    if not common:
        return result
    flat = torch.cat([named[n].detach().float().reshape(-1).cpu() for n in common])
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=group)
    diffs, start = [], 0
    for n in common:
        size = named[n].numel()
        seg = (flat[start:start + size] - ref[start:start + size]).abs()
        diffs.append(seg.max() if size else torch.tensor(0.0))
        start += size
    vec = torch.nan_to_num(torch.stack(diffs), nan=float("inf"))
    dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
    result.update({n: float(v) for n, v in zip(common, vec.tolist())})
    return result
