"""The logged check's part on rows an all_gather pads (logged.py attaches it).

The invariant: a number computed over rows the ranks gathered (an accuracy, a mean loss, a
count of hits) is computed over the rows the ranks hold, never over the padding that made their
parts one size. The script tells us both: it gathers each rank's size (`all_gather` of a
one-element integer tensor, or `all_gather_object` of ints), then gathers parts of the largest
size; part i's rows from sizes[i] on are padding (checked: they are one constant, the fill).
Those rows are followed, as a mask over the leading dimension, through the ops that keep rows
(comparisons, arithmetic, casts, reshapes, indexing, `torch.cat` / `torch.stack` of the parts),
and a reduction over the rows (sum, mean, count_nonzero) whose value differs from the same
reduction over the real rows only is recorded, with the line that joined the parts whole (or
the reduction's, where they were never joined). Masking the padding (a product with a 0/1
mask, `& valid`) or cutting it (`part[:n]`, `x[valid]`) makes the two values equal: nothing is
recorded. The ops are followed only from such a gather to the end of its step.
"""
from __future__ import annotations

import sys
import weakref

from .api import Finding

ROW_OPS = ("__eq__", "eq", "ne", "lt", "le", "gt", "ge", "__and__", "__or__", "__xor__",
           "__invert__", "logical_and", "logical_or", "logical_not", "add", "sub", "mul", "div",
           "float", "long", "int", "bool", "double", "half", "to", "type", "cpu", "clone",
           "detach", "contiguous", "view", "reshape", "flatten", "squeeze", "argmax", "argmin",
           "softmax", "log_softmax", "sigmoid", "abs", "exp", "log", "where", "__getitem__")
REDUCTIONS = ("sum", "mean", "nansum", "nanmean", "count_nonzero")
JOINS = ("cat", "concat", "concatenate", "stack")
BUDGET = 5000  # handler calls at most per padded gather (the user's ops until the step's end)


def padding_functions():
    import torch

    names = set(ROW_OPS) | set(REDUCTIONS)
    funcs = [getattr(torch.Tensor, n) for n in sorted(names) if hasattr(torch.Tensor, n)]
    funcs += [getattr(torch, n) for n in sorted(names | set(JOINS))
              if hasattr(torch, n) and not n.startswith("_")]
    return funcs


class Padding:
    """On one rank: the sizes the script gathered, the rows of gathered parts that are padding
    (weakly held: {id: (ref, mask, joined line)}), and the handler that follows them."""

    def __init__(self, ctx, funcs):
        self.ctx = ctx
        self.sizes, self.marks, self.budget = None, {}, 0
        self.handler = self.on_op  # the core guards it
        self.switch = ctx.handler_switch(funcs, self.handler)

    @property
    def on(self) -> bool:
        """Whether the handler is in the core's table now."""
        return self.switch.on

    def stop(self, *_):
        """The step's end: the sizes, the rows and the handler go."""
        self.sizes, self.marks = None, {}
        self.switch.set(False)

    def _mark(self, t, mask, joined):
        self.marks[id(t)] = (weakref.ref(t), mask, joined)

    def mask_of(self, t):
        found = self.marks.get(id(t))
        return found if found is not None and found[0]() is t else None

    # --- the collectives (called after the script's own returned) -------------------------
    def gathered_sizes(self, values) -> None:
        if values and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                          for v in values):
            self.sizes = list(values)

    def gathered(self, parts) -> None:
        import torch

        if not isinstance(parts, (list, tuple)) or not parts or not all(
                isinstance(p, torch.Tensor) for p in parts):
            return
        if all(p.dim() == 1 and 1 <= p.numel() <= 4 and not p.is_floating_point()
               and not p.is_complex() and p.dtype != torch.bool for p in parts):
            self.gathered_sizes([int(p[0]) for p in parts])
            return
        sizes = self.sizes
        if not sizes or len(sizes) != len(parts) or len(set(sizes)) < 2:
            return
        top = max(sizes)
        if not all(p.dim() > 0 and p.shape[0] == top for p in parts):
            return
        rows = torch.arange(top)
        for p, n in zip(parts, sizes):
            tail = p[n:].detach()
            if n < top and bool((tail == tail.reshape(-1)[0]).all()):
                self._mark(p, rows >= n, None)
        self._follow()

    def gathered_into(self, out, line) -> None:
        """all_gather_into_tensor: the parts joined whole in `out` by the collective itself."""
        import torch

        sizes = self.sizes
        if not sizes or len(set(sizes)) < 2 or not isinstance(out, torch.Tensor) or \
                out.dim() == 0 or out.shape[0] != len(sizes) * max(sizes):
            return
        top, rows = max(sizes), torch.arange(max(sizes))
        parts = out.detach().split(top)
        if all(n == top or bool((p[n:] == p[n:].reshape(-1)[0]).all())
               for p, n in zip(parts, sizes)):
            self._mark(out, torch.cat([rows >= n for n in sizes]), line)
            self._follow()

    def _follow(self):
        if self.marks:
            self.budget = BUDGET
            self.switch.set(True)

    # --- the user's ops ------------------------------------------------------------------
    def on_op(self, func, args, kwargs, out):
        import torch

        self.budget -= 1
        if self.budget < 0:
            return self.stop()
        name = func.__name__
        if name in JOINS:
            return self._join(name, args, kwargs, out)
        inputs = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        found = [m for m in map(self.mask_of, inputs) if m is not None]
        if not found or not isinstance(out, torch.Tensor):
            return
        t, (_, mask, joined) = inputs[0], found[0]
        if name == "__getitem__":
            if self.mask_of(t) is not None:
                self._index(args, out, mask, joined)
            return
        if name in REDUCTIONS and self.mask_of(t) is not None and _over_rows(args, kwargs):
            return self._reduced(func, t, args, kwargs, out, mask, joined)
        if mask.dim() > 1 and name in ("view", "reshape", "flatten") and out.dim() and \
                out.shape[0] == mask.numel() and out.numel() == t.numel():
            mask = mask.reshape(-1)  # stacked parts, (ranks, rows) -> rows
        if out.dim() >= mask.dim() and tuple(out.shape[:mask.dim()]) == tuple(mask.shape):
            for _, other, _ in found[1:]:
                if other.shape == mask.shape:
                    mask = mask | other
            self._mark(out, mask, joined)

    def _join(self, name, args, kwargs, out):
        import torch

        parts = args[0] if args else kwargs.get("tensors")
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if dim != 0 or not isinstance(parts, (list, tuple)):
            return
        masks = [self.mask_of(p) for p in parts]
        if not any(masks) or not all(isinstance(p, torch.Tensor) and p.dim() > 0 for p in parts):
            return
        own = [m[1] if m is not None and m[1].dim() == 1 else
               torch.zeros(p.shape[0], dtype=torch.bool) for p, m in zip(parts, masks)]
        if name == "stack":
            if len({m.shape for m in own}) != 1:
                return
            mask = torch.stack(own)
        else:
            mask = torch.cat(own)
        self._mark(out, mask, self.ctx.user_line(self._user_frame()))

    def _index(self, args, out, mask, joined):
        index = args[1] if len(args) > 1 else None
        if isinstance(index, tuple):
            index = index[0] if index else None
        if hasattr(index, "device"):
            index = index.cpu()  # the masks live on the CPU
        try:
            kept = mask[index]
        except (IndexError, TypeError, RuntimeError):
            return
        rows = tuple(kept.shape)
        if kept.dim() and tuple(out.shape[:kept.dim()]) == rows and bool(kept.any()):
            self._mark(out, kept, joined)

    def _reduced(self, func, t, args, kwargs, out, mask, joined):
        import torch

        real = t[(~mask).to(t.device)]
        if mask.dim() > 1:  # stacked parts: (ranks, rows, ...) -> rows
            real = real.reshape(-1, *t.shape[mask.dim():])
        again = func(real, *args[1:], **kwargs)
        same = torch.allclose(again.double(), out.detach().double(), rtol=1e-5, atol=1e-8,
                              equal_nan=True) if again.shape == out.shape else False
        if same:
            return
        line = self.ctx.user_line(self._user_frame())
        self.ctx.add("logged.padding", {
            "s": self.ctx.step, "line": joined or line, "at": line, "fn": func.__name__,
            "pad": int(mask.sum()), "rows": int(mask.numel()),
            "v": float(out) if out.numel() == 1 else None,
            "real": float(again) if again.numel() == 1 else None})

    def _user_frame(self):
        frame = sys._getframe(2)
        while frame is not None and not self.ctx.is_user_file(frame.f_code.co_filename):
            frame = frame.f_back
        return frame


def wrap_gathers(ctx, dist, padding) -> dict:
    """The script's all_gather, all_gather_object and all_gather_into_tensor, seen after they
    return (sizes, then parts padded to the largest; _logged_padding.py)."""
    gather, objects, into = dist.all_gather, dist.all_gather_object, dist.all_gather_into_tensor

    def all_gather(tensor_list, *args, **kwargs):
        out = gather(tensor_list, *args, **kwargs)
        if not kwargs.get("async_op"):
            ctx.guard(padding.gathered)(tensor_list)
        return out

    def all_gather_object(object_list, *args, **kwargs):
        out = objects(object_list, *args, **kwargs)
        ctx.guard(padding.gathered_sizes)(list(object_list))
        return out

    def all_gather_into_tensor(output_tensor, *args, **kwargs):
        out = into(output_tensor, *args, **kwargs)
        if not kwargs.get("async_op"):
            ctx.guard(lambda: padding.gathered_into(output_tensor, ctx.user_line()))()
        return out

    wrapped = {"all_gather": (all_gather, gather),
               "all_gather_object": (all_gather_object, objects),
               "all_gather_into_tensor": (all_gather_into_tensor, into)}
    for name, (mine, _) in wrapped.items():
        setattr(dist, name, mine)
    return wrapped


def _over_rows(args, kwargs) -> bool:
    """A reduction over every element, or over the leading dimension."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dim, (list, tuple)):
        return 0 in dim
    return dim is None or dim == 0


# --- in the parent ----------------------------------------------------------------------------
def judge_padding(ev) -> list[Finding]:
    seen = {}
    for r, rec in enumerate(ev.ranks):
        for e in rec.get("logged.padding", []):
            seen.setdefault(e["line"], (r, e))
    out = []
    for line, (r, e) in seen.items():
        value = (f"{e['fn']} gives {e['v']:.6g} over all {e['rows']} rows, {e['real']:.6g} over "
                 f"the {e['rows'] - e['pad']} real ones" if e["v"] is not None and
                 e["real"] is not None else f"{e['fn']} differs with and without them")
        out.append(Finding(
            "warning", "gathered-padding-counted", "14",
            f"a value computed over all_gather'ed rows counts {e['pad']} padding row(s) of "
            f"{e['rows']}: the parts padded to the largest rank's size were joined whole",
            [f"rank {r}, step {e['s']}: at {e['at'] or 'a reduction'}: {value}",
             "the script gathered each rank's size first; the rows past a rank's size are the "
             "fill that made the parts one size, and they count as data here"],
            fix="cut each gathered part to its rank's size before joining or reducing: "
                "torch.cat([part[:n] for part, n in zip(parts, sizes)])",
            where=line))
    return out
