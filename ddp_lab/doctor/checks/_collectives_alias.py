"""The collectives check: a collective that writes several outputs is given outputs that do not
share memory (`collective-outputs-alias`).

all_gather(tensor_list, tensor) writes rank i's part into tensor_list[i]; all_to_all writes
the part from rank i into output_tensor_list[i]; gather writes it into gather_list[i] on dst
(torch 2.13's docstrings in torch/distributed/distributed_c10d.py). Two entries that are one
memory (`[torch.zeros_like(t)] * world_size` repeats ONE tensor) receive two ranks' parts in
turn: the entry holds whichever was written last, and the list shows it twice while the other
rank's part is lost. Which one survives is the backend's order (gloo with this build: the last
rank's, per the blind case b53's measurement); no order gives the right list.

On each rank, only for the script's own call (a library's is not judged): the output list's
tensors are compared by their storage (`untyped_storage().data_ptr()`) and byte range. Two
entries alias when they are the same view, or when both are contiguous and their byte ranges
overlap; strided views of one buffer (`[buf[:, i] for i in ...]`, which interleave without
sharing an element) are not judged (the byte-range test cannot tell them apart: never a false
alarm). all_gather_object's list holds Python objects (pickled, then replaced), and the lists
of reduce_scatter / scatter are inputs, read only: neither is judged. One record per line.
"""
from __future__ import annotations

import ast

from ..userline import describe
from .api import Finding

KEY = "collective-aliases"
LISTS = {"all_gather": "tensor_list", "all_to_all": "output_tensor_list", "gather": "gather_list"}
AT = {"all_gather": 0, "all_to_all": 0, "gather": 1}  # the list's position in the call


def _span(t):
    """(storage pointer, first byte, end byte) of a tensor's memory."""
    size = t.element_size()
    first = t.storage_offset() * size
    if t.numel() == 0:
        return t.untyped_storage().data_ptr(), first, first
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.untyped_storage().data_ptr(), first, first + extent * size


def _same(a, b) -> bool:
    """Whether two tensors share memory: one view, or two contiguous overlapping byte ranges."""
    if a is b:
        return True
    pa, fa, ea = _span(a)
    pb, fb, eb = _span(b)
    if pa != pb or pa == 0 or fa >= eb or fb >= ea:
        return False
    if (fa, a.shape, a.stride()) == (fb, b.shape, b.stride()):
        return True
    return a.is_contiguous() and b.is_contiguous()


def shared(op, bound):
    """[[i, j], ...]: the entries of the call's output list that share memory (each j with the
    first i it shares with), or None."""
    import torch

    outs = bound.get(LISTS.get(op, ""))
    if not isinstance(outs, (list, tuple)) or len(outs) < 2:
        return None
    ts = [t for t in outs if isinstance(t, torch.Tensor)]
    if len(ts) != len(outs):
        return None
    pairs, by_storage = [], {}
    for j, t in enumerate(ts):  # compared only with the entries of the same storage
        held = by_storage.setdefault(t.untyped_storage().data_ptr(), [])
        i = next((i for i in held if _same(ts[i], t)), None)
        if i is not None:
            pairs.append([i, j])
        held.append(j)
    return pairs or None


def made_at(path: str, lineno: int, op: str):
    """The line the call's output list was made on: the last assignment of its name, in the
    function around the call, before the call's line (read from the source); None."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.lineno <= lineno <= (n.end_lineno or n.lineno)]
    scope = max(funcs, key=lambda n: n.lineno) if funcs else tree
    name = None
    for n in ast.walk(scope):
        if (isinstance(n, ast.Call) and n.lineno <= lineno <= (n.end_lineno or n.lineno)
                and getattr(n.func, "attr", getattr(n.func, "id", None)) == op):
            arg = n.args[AT[op]] if len(n.args) > AT[op] else next(
                (k.value for k in n.keywords if k.arg == LISTS[op]), None)
            name = arg.id if isinstance(arg, ast.Name) else None
    if name is None:
        return None
    lines = [n.lineno for n in ast.walk(scope) if isinstance(n, (ast.Assign, ast.AnnAssign))
             and n.lineno < lineno and any(isinstance(t, ast.Name) and t.id == name
                                           for t in getattr(n, "targets", [getattr(n, "target", None)]))]
    return max(lines) if lines else None


def record(ctx, op, bound, line, frame, seen):
    """On a rank, the script's own call: record its aliased outputs once per line."""
    if line in seen or op not in LISTS:
        return
    pairs = shared(op, bound)
    if pairs is None:
        return  # (gather: only dst may pass a gather_list, _validate_output_list_for_rank)
    seen.add(line)
    made = made_at(frame.f_code.co_filename, frame.f_lineno, op)
    ctx.add(KEY, {"op": op, "line": line, "step": ctx.step, "pairs": pairs, "n": len(bound[LISTS[op]]),
                  "made": describe(frame.f_code.co_filename, made) if made else ""})


def per_line(ev, key: str) -> dict:
    """{line: {rank: record}} of the ranks' records under `key` (one record per line a rank)."""
    by_line: dict = {}
    for r, rec in enumerate(ev.ranks):
        for e in rec.get(key, []):
            by_line.setdefault(e["line"], {})[r] = e
    return by_line


def judge_aliases(ev) -> list:
    out = []
    for line, per_rank in per_line(ev, KEY).items():
        e = per_rank[min(per_rank)]
        groups: dict = {}
        for i, j in e["pairs"]:
            root = next((g for g, m in groups.items() if i in m), i)
            groups.setdefault(root, {root}).add(j)
        told = "; ".join(f"entries {', '.join(str(x) for x in sorted(m))} share memory" for m in
                         groups.values())
        part = {"all_gather": "rank i's part", "all_to_all": "the part from rank i",
                "gather": "rank i's part"}[e["op"]]
        out.append(Finding(
            "error", "collective-outputs-alias", "13",
            f"dist.{e['op']}'s output list shares memory: ranks' parts overwrite each other",
            [f"dist.{e['op']} at {line} (step {e['step']}) writes {part} into entry i of its "
             f"{e['n']}-entry output list; {told}",
             "each of those entries receives several ranks' parts in turn and keeps the last "
             "written: the list holds that one part several times and the other ranks' parts are "
             "lost (any value computed from it, a gathered metric, counts one rank's data W times)",
             *([f"the list was made at {e['made']}"] if e["made"] else []),
             f"seen on rank {', '.join(str(r) for r in sorted(per_rank))}"],
            fix="make one tensor per entry: `[torch.zeros_like(t) for _ in range(world_size)]` "
                "(`[x] * n` repeats one tensor n times), or gather into one tensor with "
                "dist.all_gather_into_tensor",
            where=e["made"] or line))
    return out
