"""DDP's settings against what DDP saw over the run: `find_unused_parameters=True` on a model
that never had an unused parameter (lesson 01).

With the flag on, DDP's reducer walks the autograd graph from forward's outputs after every
forward of a synchronised step, to mark the parameters that will get no gradient as ready
(torch/nn/parallel/distributed.py `_post_forward`: `reducer.prepare_for_backward(outputs)`),
and all-reduces a map of which parameters each rank used. When no step ever had an unused
parameter, that traversal and that all-reduce are paid every step for nothing.

What the ranks read (torch 2.13):
- the reducer's used map, `DDP.reducer._get_local_used_map()` (torch/_C/_distributed_c10d.pyi),
  after each optimizer step: one int per parameter of the reducer, the SUM over ranks of "this
  rank used it" once the step's backward has all-reduced it (measured: 2 on two ranks for a used
  parameter, 1 for one rank's, 0 for none's; it holds until the next backward). A step whose
  map has an entry below the group's size had an unused parameter on some rank.
- DDP's own logging data, `DDP._get_ddp_logging_data()`, at the end: `find_unused_parameters`
  and `unused_parameter_size`, quoted as DDP's word. That field is filled in the forward of the
  sampled iterations only (distributed.py `_set_ddp_runtime_logging_sample_rate`: the first 10,
  then every `kDDPRuntimeLoggingSampleRate` = 100, include/torch/csrc/distributed/c10d/
  reducer.hpp:33) and describes the iteration before (measured: a parameter unused at step 12
  leaves it 0), so it cannot say "never" on its own; the used map is read every step.

Quiet when the flag is off, under `static_graph=True` (DDP finds the unused parameters once),
when any step had an unused parameter (LayerDrop, stochastic depth, expert routing: the flag is
needed there), or when fewer than two steps were seen.
"""
from __future__ import annotations

import ast
import functools
import os

from ..userline import describe
from . import _ddp_settings_accum as accum
from .api import Check, Finding

KEY = "ddp-settings"
FLAG = "find_unused_parameters"
MIN_STEPS = 2


class _Models:
    """The DDP models built with find_unused_parameters=True, and what each step's map said."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.models: list[tuple] = []  # (Watched, record)

    def wrapped(self, ctx, w) -> None:
        if w.kind != "ddp" or not getattr(w.wrapper, FLAG, False):
            return
        found = ctx.user_frame()
        rec = {"line": w.line, "keyword": _keyword_line(*found[:2]) if found else "",
               "static_graph": bool(getattr(w.wrapper, "static_graph", False)),
               "world": w.wrapper.process_group.size(), "steps": 0, "unused_steps": 0,
               "first_unused": None, "wrapped_step": ctx.step}
        if not self.models:
            ctx.on_step_end(self.step_ended)
            ctx.on_finish(self.finished)
        self.models.append((w, rec))
        self._emit()

    def step_ended(self, ctx) -> None:
        for w, rec in self.models:
            used = w.wrapper.reducer._get_local_used_map()
            if used.numel() == 0:
                continue
            lo, hi = (int(v) for v in used.aminmax())
            if hi == 0:  # no backward through this model yet
                continue
            rec["steps"] += 1
            if lo < rec["world"]:
                rec["unused_steps"] += 1
                if rec["first_unused"] is None:
                    rec["first_unused"] = ctx.step
                    self._emit()
            if rec["steps"] == MIN_STEPS:
                self._emit()

    def finished(self, ctx) -> None:
        for w, rec in self.models:
            data = w.wrapper._get_ddp_logging_data()
            rec["logging"] = {k: data.get(k) for k in (FLAG, "unused_parameter_size", "iteration")}
        self._emit()

    def _emit(self) -> None:
        self.ctx.emit(KEY, [dict(rec) for _, rec in self.models])


def attach(ctx) -> None:
    ctx.on_model(_Models(ctx).wrapped)
    ctx.on_model(accum.Accumulations(ctx).wrapped)


def _tree(path: str):
    try:
        return _parsed(path, os.stat(path).st_mtime_ns)
    except OSError:
        return None


@functools.lru_cache(maxsize=8)
def _parsed(path: str, mtime: int):
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def _keyword_line(path: str, lineno: int) -> str:
    """The line that sets find_unused_parameters=True for the DDP(...) built at `lineno`: the
    keyword of the call spanning that line; else the one place of the file that names it (a
    keyword or a dict key: `ddp_kwargs = dict(find_unused_parameters=True)`); else ""."""
    tree = _tree(path)
    if tree is None:
        return ""
    places = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == FLAG:
                    if node.lineno <= lineno <= (node.end_lineno or node.lineno):
                        return describe(path, kw.value.lineno)
                    places.append(kw.value.lineno)
        elif isinstance(node, ast.Dict):
            places += [k.lineno for k in node.keys if isinstance(k, ast.Constant) and k.value == FLAG]
    return describe(path, places[0]) if len(set(places)) == 1 else ""


def judge(ev) -> list[Finding]:
    return _judge_unused(ev) + [_accum_finding(rec) for rec in accum.judged(ev)]


def _judge_unused(ev) -> list[Finding]:
    per_rank = [r.get(KEY) or [] for r in ev.ranks]
    if not any(per_rank):
        return []
    found = []
    for i, rec in enumerate(per_rank[0]):
        recs = [p[i] for p in per_rank if len(p) > i]
        if rec["static_graph"] or any(r.get("unused_steps") or r.get("first_unused") is not None
                                      for r in recs):
            continue
        steps = min(r.get("steps", 0) for r in recs)
        if len(recs) < ev.world_size or steps < MIN_STEPS:
            continue
        found.append(_finding(rec, steps, ev.world_size))
    return found


def _finding(rec: dict, steps: int, world: int) -> Finding:
    logged = rec.get("logging") or {}
    ev = [f"every rank used every parameter in each of the {steps} steps watched (DDP's own map "
          f"of used parameters, all-reduced each step: every entry {world} of {world} ranks)",
          "with the flag on, DDP walks the autograd graph from forward's outputs after every "
          "forward and all-reduces that map, to find parameters that will get no gradient: "
          "here it never found one"]
    if logged:
        ev.append(f"DDP's logging data (_get_ddp_logging_data()): {FLAG}="
                  f"{logged.get(FLAG)}, unused_parameter_size={logged.get('unused_parameter_size')}"
                  f" (sampled in the first 10 iterations, then 1 in 100)")
    ev.append(f"DDP built at {rec['line']}" if rec.get("line") else "")
    return Finding(
        "warning", "find-unused-parameters-unneeded", "01",
        "DDP(find_unused_parameters=True), but no parameter was ever unused: an extra autograd "
        "traversal and all-reduce every step, for nothing",
        [e for e in ev if e],
        "drop find_unused_parameters=True (the default, False, is right when forward uses every "
        "parameter on every step); keep it only for models that skip parameters on some steps "
        "(LayerDrop, stochastic depth, expert routing), which DDP would otherwise refuse with "
        "'Expected to have finished reduction'",
        where=rec.get("keyword") or rec.get("line", ""), strategies=("ddp",))


def _accum_finding(rec: dict) -> Finding:
    ev = [f"in {rec['wasted_steps']} of {rec['steps']} optimizer steps, a backward of this DDP model "
          f"accumulated into gradients that an earlier backward of the same step had already "
          f"all-reduced ({rec['wasted']} such backwards on rank 0): DDP all-reduced every "
          f"micro-batch, and only the last all-reduce before the step counts",
          "DDP all-reduces the gradients of every backward whose forward ran with "
          "require_backward_grad_sync=True (not under model.no_sync()); the step's result is "
          "the same, the traffic is one all-reduce per micro-batch instead of one per step"]
    if rec.get("backward_only"):
        ev.append(f"{rec['backward_only']} backward(s) ran under model.no_sync() while their forward "
                  "ran outside it: DDP prepared the all-reduce in the forward, and synchronised "
                  "them all the same (no_sync's docstring: the forward pass should be included "
                  "inside the context manager)")
    ev.append(f"DDP built at {rec['line']}" if rec.get("line") else "")
    return Finding(
        "warning", "accumulation-syncs-every-micro-batch", "01",
        ("gradient accumulation on a DDP model with no_sync() around the backward but not the "
         "forward" if rec.get("backward_only") else
         "gradient accumulation on a DDP model without no_sync()")
        + ": the gradients are all-reduced on every micro-batch's backward, not once per "
          "optimizer step",
        [e for e in ev if e],
        "run the forward AND backward of every micro-batch but the last under `with "
        "model.no_sync():` (or set model.require_backward_grad_sync = (last micro-batch) before "
        "the forward, as nanoGPT does): DDP then all-reduces once, on the last backward",
        where=rec.get("where") or rec.get("line", ""), strategies=("ddp",))


CHECK = Check(
    name="ddp_settings",
    mechanism="DDP's settings against what DDP saw over the run: find_unused_parameters=True "
              "when no step ever had an unused parameter; gradient accumulation that DDP "
              "all-reduces on every micro-batch (no no_sync())",
    lesson="01",
    codes={"find-unused-parameters-unneeded": "warning",
           "accumulation-syncs-every-micro-batch": "warning"},
    attach=attach, judge=judge, tools=("watch",), strategies=("ddp",),
    tests=("tests/doctor/checks/test_ddp_settings.py", "tests/doctor/checks/test_ddp_settings_accum.py"),
    notes=("judged over the steps the watched run took: a model that skips a parameter only "
           "later (a phase the run did not reach) needs the flag all the same",
           "static_graph=True is not judged (DDP finds the unused parameters once, itself)",
           "accumulation: not judged under static_graph=True or a comm hook (the hook decides "
           "what is sent); zero_grad(set_to_none=False) between two backwards with no step "
           "between reads as accumulation"))
