"""The logged check's part on what `backward()` runs on (logged.py attaches it): the criterion's
output, scaled by numbers only, down to the tensor `backward()` is called on, and in the parent
the mass of each optimizer step's update against the one-process update.

The rule. Under a wrapper that averages the gradients over its W ranks (DDP without a comm hook
of the user's; FSDP2 without a gradient divide factor of the user's), rank r's micro-batch j adds
(1/W) x w_rj x grad(m_rj) to the update, where m_rj is the criterion's mean over its terms and
w_rj = backward value / m_rj (the scale of the tensor `backward()` runs on; for a sum reduction
m = sum / n). The step's mass T = (1/W) x sum over r, j of w_rj is 1 in every correct script:
a mean loss (w = 1), accumulated over k micro-batches (w = 1/k each), a sum divided by the
rank's own count (w = 1), or weighted by W x n_rj / N (w summing to W). A loss divided by the
world size makes T = 1/W on every step: each update is 1/W of the one process's on the same
global batch (DDP averages already). It is told from a legitimate division by where the
divisor comes from: the line that scaled the loss divides by a number the script holds that
equals the world size (a name, an attribute, get_world_size(); never a literal, which would
be the same number at world size 1), or every w_rj is n_rj / N (a sum divided by the count of
every rank's terms) while the ranks' counts differ.
"""
from __future__ import annotations

import ast
import sys

from ._logged_lines import expression_at, name_of, value_of
from .api import Finding

DIV = {"div", "div_", "true_divide", "divide"}  # `a / b` and `a /= b` reach the mode as div, div_
MUL = {"mul", "mul_", "multiply"}
# the pytorch hooks that average as DDP's reducer does (torch 2.13: default_hooks.py:26,71,
# mixed_precision_hooks.py:51, optimizer_overlap_hooks.py:81, powerSGD_hook.py)
AVERAGING_HOOKS = ("default_hooks", "mixed_precision_hooks", "optimizer_overlap_hooks",
                   "powerSGD_hook")
TOL = 1e-4


def scale_functions():
    import torch

    return [getattr(torch.Tensor, n) for n in sorted(DIV | MUL)] + [torch.div, torch.mul]


class Scaling:
    """On one rank: from a criterion's output (with gradient) to the next backward, the tensors
    made from it by a multiplication or a division by a number, and the lines that did it. The
    handler is in the core's table only while a criterion's output waits for its backward."""

    def __init__(self, ctx, funcs):
        self.ctx, self.chain, self.ops = ctx, [], []
        self.handler = self.on_op  # the core guards it (a guard inside a guard does nothing)
        self.switch = ctx.handler_switch(funcs, self.handler)
        self.users, self.lines = {}, {}  # code -> is the user's; (code, line) -> its text

    @property
    def on(self) -> bool:
        """Whether the handler is in the core's table now."""
        return self.switch.on

    def start(self, out) -> None:
        self.chain, self.ops = [out], []
        self.switch.set(True)

    def stop(self, *_):
        self.chain, self.ops = [], []
        self.switch.set(False)

    def on_op(self, func, args, kwargs, out):
        import torch

        a = args[0] if args else kwargs.get("input")
        b = args[1] if len(args) > 1 else kwargs.get("other")
        name = func.__name__
        if name in MUL and not any(a is t for t in self.chain):
            a, b = b, a
        if not any(a is t for t in self.chain) or kwargs.get("rounding_mode") is not None:
            return
        if isinstance(b, torch.Tensor) and (b.numel() != 1 or b.requires_grad):
            return  # not a number: what backward() runs on is no longer the loss scaled
        self.chain.append(out)
        frame = self._user_frame()
        if frame is None:
            self.ops.append({"line": "", "ws": False})
            return
        at = (frame.f_code, frame.f_lineno)
        if at not in self.lines:
            self.lines[at] = self.ctx.user_line(frame)
        self.ops.append({"line": self.lines[at],
                         "ws": divides_by_world(frame, name in DIV, self.ctx.world_size)})

    def _user_frame(self):
        frame, users = sys._getframe(2), self.users
        while frame is not None:
            code = frame.f_code
            if code not in users:
                users[code] = self.ctx.is_user_file(code.co_filename)
            if users[code]:
                return frame
            frame = frame.f_back
        return None

    def finish(self, t) -> dict:
        """What the backward record adds: whether `t` is the last criterion's output scaled by
        numbers only, and the scaling lines; the handler leaves the table."""
        found = {"pure": any(t is c for c in self.chain)} if self.chain else {}
        if found.get("pure") and self.ops:
            found["by"] = self.ops[:4]
        self.stop()
        return found


def divides_by_world(frame, divides: bool, world: int) -> bool:
    """Whether the expression running in `frame` (a / x, a * x, a /= x, a.div(x), torch.div(a,
    x)) divides by a number that equals the world size and is not a literal: a name, an
    attribute chain, get_world_size() or int(os.environ["WORLD_SIZE"])."""
    node = expression_at(frame)
    if world < 2 or node is None:
        return False
    if isinstance(node, ast.BinOp):
        parts = _factors(node, 1)
    elif isinstance(node, ast.AugAssign):
        parts = _factors(node.value, -1 if isinstance(node.op, (ast.Div, ast.FloorDiv)) else 1)
    elif isinstance(node, ast.Call) and node.args and name_of(node) in DIV | MUL:
        method = len(node.args) == 1  # loss.div(x); torch.div(loss, x)
        parts = _factors(node.args[0] if method else node.args[-1], -1 if divides else 1)
    else:
        return False
    return any(sign < 0 and not isinstance(leaf, ast.Constant) and _int(leaf, frame) == world
               for leaf, sign in parts)


def _factors(node, sign):
    """The leaves of a product or quotient with their exponent's sign (a / (b * c): a +, b -,
    c -)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _factors(node.left, sign) + _factors(node.right, sign)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
        return _factors(node.left, sign) + _factors(node.right, -sign)
    return [(node, sign)]


def _int(node, frame):
    if isinstance(node, ast.Call) and name_of(node) == "get_world_size":
        import torch.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else None
    if isinstance(node, ast.Call) and name_of(node) in ("int", "float") and len(node.args) == 1:
        inner = node.args[0]
        v = _int(inner, frame) if isinstance(inner, ast.Call) else value_of(inner, frame)
        return int(v) if isinstance(v, str) and v.isdigit() else v if isinstance(v, int) else None
    v = value_of(node, frame)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def averaging(ctx) -> list[dict]:
    """{kind, avg}: per model the script wrapped, the number of ranks its gradients are averaged
    over (None: summed, or a comm hook or divide factor of the user's)."""
    out = []
    for w in ctx.models:
        if w.kind == "ddp":
            hooks = getattr(w.wrapper, "_comm_hooks", [])
            ours = all(str(getattr(getattr(h, "func", h), "__module__", "")).rsplit(".", 1)[-1]
                       in AVERAGING_HOOKS for h, _ in hooks)
            pg = getattr(w.wrapper, "process_group", None)
            out.append({"kind": "ddp", "avg": pg.size() if ours and pg is not None else None})
        elif w.kind == "fsdp2":
            out.append({"kind": "fsdp2", "avg": _fsdp_average(w.module)})
    return out


def _fsdp_average(root):
    size = None
    for m in root.modules():
        group = getattr(getattr(m, "_get_fsdp_state", lambda: None)(), "_fsdp_param_group", None)
        if group is None:
            continue
        if group.gradient_divide_factor is not None:
            return None
        info = group.mesh_info
        size = getattr(info, "shard_mesh_size", 1) * getattr(info, "replicate_mesh_size", 1)
    return size


# --- in the parent ----------------------------------------------------------------------------
def _weights(events):
    """{step: [(w, n, ops)]} of one rank: per backward, its scale against the criterion's mean
    (w), the criterion's count of terms and the scaling lines; a step with a backward that is
    not one criterion's output scaled by numbers is left out."""
    steps, bad, last = {}, set(), None
    for e in events:
        if e["fn"] != "backward":
            last = e if e.get("grad") else last
            continue
        s = e["s"]
        if not e.get("pure") or last is None or last["red"] not in ("mean", "sum") or not (
                last.get("n", 0) > 0 and last["v"]):
            bad.add(s)
            continue
        w = e["v"] / last["v"] * (last["n"] if last["red"] == "sum" else 1.0)
        steps.setdefault(s, []).append((w, last["n"], e.get("by", [])))
        last = None
    return {s: m for s, m in steps.items() if s not in bad}


def judge_mass(ev, train) -> list[Finding]:
    wrappers = [w for r in ev.ranks for w in r.get("logged.wrappers", [])]
    avg = {w["avg"] for w in wrappers}
    if not wrappers or len(avg) != 1 or None in avg or min(avg) < 2:
        return []
    world = avg.pop()
    per = [_weights(t) for t in train]
    common = sorted(set.intersection(*(set(p) for p in per))) if per else []
    hit, right = [], 0
    for s in common:
        micro = [x for p in per for x in p[s]]
        mass = sum(w for w, _, _ in micro) / world
        if abs(mass - 1.0) <= TOL:
            right += 1
        if abs(mass * world - 1.0) > TOL:
            continue
        lines = [op["line"] for _, _, ops in micro for op in ops if op["ws"]]
        total = sum(n for _, n, _ in micro)
        counted = len({n for _, n, _ in micro}) > 1 and all(
            abs(w * total / n - 1.0) <= TOL for w, n, _ in micro)
        if lines or counted:
            made = lines or [op["line"] for _, _, ops in micro for op in ops][-1:] or [""]
            hit.append({"s": s, "line": made[0], "global": not lines, "mass": mass,
                        "k": len(micro)})
    if not hit or right:
        return []
    return [_finding(hit, world)]


def _finding(hit, world):
    first, steps = hit[0], sorted(h["s"] for h in hit)
    by = "the count of every rank's terms (a global count)" if first["global"] else \
        "the world size"
    s, mass, k = first["s"], first["mass"], first["k"]
    return Finding(
        "warning", "loss-divided-by-world-size", "14",
        f"the loss backward() runs on is divided by {by}, and the wrapper averages the "
        f"gradients over the {world} ranks too: every update is 1/{world} of one process's "
        "on the same global batch",
        [f"step {s}: the {k} backward(s) of the {world} ranks add up to {mass:.6g} of a mean "
         f"loss's gradient once averaged (1 in a one-process run, or with the loss divided "
         "only by its accumulation steps)",
         f"the same at {len(hit)} step(s), " + (f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1
                                                else f"step {steps[0]}"),
         "DDP (and FSDP2) divide the summed gradients by the world size already "
         "(torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py: tensor.div_(size))"],
        fix="divide the loss only by the number of micro-batches it accumulates over (or by "
            "the rank's own count of terms); multiply a loss normalised by a global count by "
            "the world size. Scale the learning rate instead if a smaller step is meant",
        where=first["line"])
