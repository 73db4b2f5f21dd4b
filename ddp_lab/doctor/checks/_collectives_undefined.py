"""The collectives check, on each rank: tensors whose values a collective left undefined on this
rank, followed until the script reads them (`Undefined`).

Two routes into one invariant, "a collective's result is read only where and when it is
defined":
- async: `work = dist.all_reduce(t, async_op=True)` leaves `t` (the outputs of any collective
  called with async_op=True) undefined until `work.wait()` (or `synchronize()`, or a completed
  `is_completed()`); torch's docs for async_op say the same of every backend
  (torch/distributed/distributed_c10d.py, "Synchronous and asynchronous collective operations").
- off-root: after `dist.reduce(t, dst=d)` only rank d holds the result ("Only the process with
  rank dst is going to receive the final result", distributed_c10d.py reduce's docstring). What
  the others hold is the backend's: measured on gloo with this build (torch 2.13, CPU), element
  by element their own value, a partial sum or the full one (2 ranks, dst 0: rank 1 unchanged;
  3 ranks, dst 0: rank 1 held ranks 1+2, rank 2 its own; dst 2 of a 3-element tensor: rank 0
  held [sum, sum, own]). NCCL's ncclReduce writes recvbuff on the root only (NCCL's
  documentation: "recvbuff ... only used on root"), which leaves the others' tensors as they
  were: not measured here (no two GPUs).

A tensor left so is followed (by id, a weak reference ending it when the tensor dies) through
what is computed from it: views and results of torch functions taking it are followed too, an
in-place op on it keeps it followed, a full overwrite (zero_, fill_, copy_ from a defined tensor,
a broadcast into it) ends it. A read is where its value leaves torch: a Python number or text
(item, tolist, float(), bool(), an f-string, print), numpy, pickling (torch.save), backward, an
in-place write into a tensor that is not followed (an optimizer's update of parameters), or a
collective sending it. Watch's TorchFunctionMode serves every call only while something is
followed (Context.on_every_torch_function); at other times the collectives check costs nothing
here. The first read of each collective's result is recorded (KEY).
"""
from __future__ import annotations

import weakref

KEY = "collective-reads"
MOST = 256  # tensors followed at once (beyond: no new ones; a read of those is missed)
ESCAPES = frozenset({
    "item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__complex__",
    "__format__", "__repr__", "__str__", "numpy", "__array__", "__reduce_ex__", "__iter__",
    "backward"})
OVERWRITES = frozenset({"zero_", "fill_", "copy_", "normal_", "uniform_", "random_",
                        "bernoulli_", "exponential_", "geometric_", "cauchy_", "log_normal_"})
# the argument holding a collective's output (torch 2.13's signatures)
OUTPUT = {"all_reduce": "tensor", "broadcast": "tensor", "reduce": "tensor",
          "all_gather": "tensor_list", "all_gather_into_tensor": "output_tensor",
          "reduce_scatter": "output", "reduce_scatter_tensor": "output",
          "all_to_all_single": "output", "all_to_all": "output_tensor_list",
          "gather": "gather_list", "scatter": "tensor"}
IN_PLACE = frozenset({"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__",
                      "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
                      "__irshift__", "__imatmul__"})
RESOLVE = ("wait", "synchronize", "get_future", "get_future_result", "block_current_stream")


def _tensors(value):
    """The tensors of a value: itself, or a list's or tuple's (one level)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


class Undefined:
    """What this rank holds undefined, and the Work objects that will define it."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.ids: dict[int, tuple] = {}  # id(tensor) -> (origin, weakref)
        self.works: dict[int, tuple] = {}  # id(work) -> (work, origin, [ids])
        self.read: set[int] = set()  # origins already read (recorded once)
        self.switch = ctx.on_every_torch_function(self.seen)
        self.patched: dict = {}

    # --- following ---------------------------------------------------------------------------
    def follow(self, t, origin) -> None:
        i = id(t)
        if i in self.ids or len(self.ids) >= MOST:
            return

        def gone(ref, i=i):
            if self.ids.get(i, (None, None))[1] is ref:
                self.forget(i)
        self.ids[i] = (origin, weakref.ref(t, gone))
        self.switch(True)

    def forget(self, i: int) -> None:
        self.ids.pop(i, None)
        if not self.ids:
            self.switch(False)

    def origin_of(self, value):
        for t in _tensors(value):
            hit = self.ids.get(id(t))
            if hit is not None:
                return hit[0]
        return None

    # --- what a collective does to them (collectives.py's wrapper, before the call) ----------
    def before(self, op: str, bound: dict, rank: int) -> None:
        """A followed tensor a collective sends is read; one it overwrites is defined again."""
        t = bound.get("tensor")
        if op == "broadcast" and t is not None and id(t) in self.ids:
            src = bound.get("src")
            if src is None or src == rank:
                self.record(self.ids[id(t)][0], f"dist.broadcast(src={rank}) sent it")
            else:
                self.forget(id(t))  # rank src's value overwrites it
        elif op in ("all_reduce", "reduce") and t is not None and id(t) in self.ids:
            self.record(self.ids[id(t)][0], f"dist.{op} sent it")

    def after(self, op: str, bound: dict, work, rank: int, line: str, step: int) -> None:
        """Follow the outputs an async collective returned a Work for, and a reduce's tensor
        on a rank that is not its destination."""
        dst = bound.get("dst") if bound.get("dst") is not None else bound.get("group_dst")
        off_root = op == "reduce" and bound.get("group") is None and dst is not None and dst != rank
        outputs = _tensors(bound.get(OUTPUT.get(op, ""), None))
        if bound.get("async_op") and work is not None and outputs:
            origin = ("async", op, line, step, dst if off_root else None)
            for t in outputs:
                self.follow(t, origin)
            self.works[id(work)] = (work, origin, [id(t) for t in outputs])
            self.patch_work(type(work))
        elif off_root:
            for t in outputs:
                self.follow(t, ("off-root", op, line, step, dst))

    def resolved(self, work) -> None:
        """The Work was waited for: its outputs are defined (an off-root reduce's stay not)."""
        entry = self.works.pop(id(work), None)
        if entry is None:
            return
        _, origin, ids = entry
        for i in ids:
            if self.ids.get(i, (None,))[0] is origin:
                if origin[4] is not None:  # an async reduce, on a rank that is not dst
                    self.ids[i] = (("off-root", *origin[1:]), self.ids[i][1])
                else:
                    self.forget(i)

    def patch_work(self, cls) -> None:
        """Work's wait (and the other ways to wait for it), wrapped at its class the first time
        an async collective is followed (pybind11's class accepts new attributes)."""
        if cls in self.patched or not hasattr(cls, "wait"):
            return
        saved = self.patched[cls] = {}
        for name in RESOLVE + ("is_completed",):
            fn = getattr(cls, name, None)
            if fn is None:
                continue
            saved[name] = fn

            def method(work, *args, _fn=fn, _name=name, **kwargs):
                out = _fn(work, *args, **kwargs)
                if self.works and (_name != "is_completed" or out):
                    self.resolved(work)
                return out
            method.__name__, method.__doc__ = name, fn.__doc__
            setattr(cls, name, method)

    def unpatch(self, ctx=None) -> None:
        for cls, saved in self.patched.items():
            for name, fn in saved.items():
                setattr(cls, name, fn)
        self.patched.clear()

    # --- every torch call, while something is followed ----------------------------------------
    def seen(self, func, args, kwargs, result) -> None:
        ids = self.ids
        hit = None
        for a in (*args, *kwargs.values()) if kwargs else args:
            found = ids.get(id(a))  # a tensor's id (a list's is never among them)
            if found is None and type(a) in (list, tuple):
                found = next((ids[id(b)] for b in a if id(b) in ids), None)
            if found is not None:
                hit = found[0]
                break
        if hit is None:
            return
        name = getattr(func, "__name__", "")
        if name in OUTPUT or name == "broadcast_object_list":
            return  # a collective: its wrapper (before) said what it does
        first = args[0] if args else None
        first_followed = first is not None and any(id(t) in ids for t in _tensors(first))
        if name in ESCAPES:
            self.record(hit, _how(func))
        elif name in OVERWRITES and first_followed and not any(
                id(t) in ids for a in args[1:] for t in _tensors(a)):
            for t in _tensors(first):
                self.forget(id(t))
        elif name == "__setitem__":
            value_followed = len(args) > 2 and any(id(t) in ids for t in _tensors(args[2]))
            if first_followed and not value_followed:
                self.forget(id(first))  # a part written: what is read next may be defined
            elif not first_followed and value_followed:
                self.record(hit, f"{_how(func)} wrote it into another tensor")
        elif _in_place(name) or "out" in kwargs:
            if not first_followed or "out" in kwargs:
                self.record(hit, f"{_how(func)} wrote it into another tensor")
        else:
            for t in _tensors(result):
                self.follow(t, hit)

    def record(self, origin, how: str) -> None:
        """The first read of a collective's result: recorded, then nothing of it followed."""
        if origin in self.read:
            return
        self.read.add(origin)
        route, op, line, step, dst = origin
        self.ctx.add(KEY, {"route": route, "op": op, "made": line, "made_step": step,
                           "dst": dst, "read": self.ctx.user_line(), "how": how,
                           "step": self.ctx.step})
        for i in [i for i, (o, _) in self.ids.items() if o is origin]:
            self.forget(i)


def _in_place(name: str) -> bool:
    return (name.endswith("_") and not name.endswith("__")) or name in IN_PLACE


def _how(func) -> str:
    """"Tensor.item", "torch.stack", "Tensor.__format__" (an f-string), "torch.autograd.backward"."""
    name = getattr(func, "__name__", repr(func))
    owner = getattr(func, "__qualname__", name).split(".")[0]
    if owner.lstrip("_") in ("TensorBase", "Tensor"):
        return f"Tensor.{name}"
    if owner.startswith("_VariableFunctions") or not getattr(func, "__module__", None):
        return f"torch.{name}"
    return f"{func.__module__}.{name}"
