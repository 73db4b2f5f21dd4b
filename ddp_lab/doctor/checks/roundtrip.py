"""The checkpoint round trip's check, judged (the doctor's exam/save_load.py does the saving and
loading on the ranks, or in this process for DDP's torch.save): what did not come back, by how
much, and why; `where` is the user's line when it can be found (the line sharding a tensor by
hand, the state-dict hook's registration, the non-persistent buffer's), read in the parent from
one bare instance of the module."""
from __future__ import annotations

import re

from ..userline import line_in_class, line_in_function, site_line
from .api import Check, Evidence, Finding

TOLERANCE = 1e-6  # absolute: a round trip copies bytes, nothing is recomputed
HOOK = re.compile(r"(_register_state_dict_hook|register_state_dict_post_hook)\(")
STORE = re.compile(r"\]\s*=[^=]")  # state_dict[key] = ...: where a hook puts its tensor

DEDUP = ("{names}: plain tensors (not DTensors) whose values differ between ranks; DCP takes a "
         "plain tensor for a replicated one: every rank writes it at the same index "
         "(torch/distributed/checkpoint/planner_helpers.py:208-209) and the save planner keeps "
         "one rank's copy (_dedup_save_plans.py:42-55, from default_planner.py:141), so every "
         "rank loads that one's values")
IN_PLACE = ("dcp.load fills the tensors of the state dict you pass, in place "
            "(torch/distributed/checkpoint/filesystem.py:914: copy_ into them); {names} come from a "
            "state-dict hook that returns copies, so the parameters keep the fresh module's "
            "values; only model.load_state_dict(state_dict) after dcp.load restores them")
OUTSIDE = ("{names}: not in the state dict (a buffer registered with persistent=False): no "
           "checkpoint carries it, a resumed module has its initial value")
FIX_DEDUP = ("make the per-rank tensor a DTensor: nn.Parameter(distribute_tensor(t, mesh, "
             "[Shard(0)])) (or DTensor.from_local(shard, mesh, [Shard(0)])), so DCP saves each "
             "rank's shard")
FIX_IN_PLACE = ("return views of the parameters from the hook (t.t(), not t.t().contiguous() or "
                "a cast), or call model.load_state_dict(state_dict) after dcp.load (DCP's "
                "docstring asks for it), or checkpoint through a Stateful wrapper")
FIX_OUTSIDE = "register it as a persistent buffer (register_buffer(name, t)), or rebuild it the same way on load"


def _names(names) -> str:
    names = sorted(names)
    return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")


def round_trip_findings(records: list[dict], known: dict, placed: dict | None = None) -> list[Finding]:
    """`records`: each rank's dcp_round_trip (or the one torch_save_round_trip); `known`: the
    parent's `sites`; `placed`: {parameter name: the user's line that registered it}."""
    records = [r for r in records if r]
    if not records:
        return []
    how, lesson = records[0]["how"], ("16" if records[0]["how"] == "dcp" else "09")
    lost = {n: max(r["lost"].get(n, 0.0) for r in records) for r in records for n in r["lost"]}
    in_place = {n: d for r in records for n, d in r["in_place_only"].items() if n not in lost}
    out = []
    if lost:
        out.append(_lost(records, lost, lesson, how, known, placed or {}))
    if in_place:
        stores = [s for s, _ in known.get("hooks", {}).values() if s]
        registered = [r for _, r in known.get("hooks", {}).values() if r]
        out.append(Finding("warning", "checkpoint-round-trip-lost", lesson,
                           "dcp.load in place restores nothing of some parameters",
                           [f"{n}: differs by {d:.1e} after dcp.load" for n, d in
                            sorted(in_place.items())[:5]] + [IN_PLACE.format(names=_names(in_place))]
                           + [f"the hook registered at {r}" for r in registered[:2]],
                           fix=FIX_IN_PLACE, where=(stores or registered or [""])[0]))
    return out


def _lost(records, lost, lesson, how, known, placed) -> Finding:
    plain = {n for r in records for n in r["plain_differing"]} & set(lost)
    outside = {n for r in records for n in r["outside"]} & set(lost)
    ranks = lambda n: ", ".join(str(i) for i, r in enumerate(records) if n in r["lost"])  # noqa: E731
    evidence = [f"{n}: differs by {lost[n]:.1e} after the round trip"
                + (f" (rank {ranks(n)})" if len(records) > 1 else "") for n in sorted(lost)[:6]]
    why, fix, where = [], [], ""
    if plain:
        why.append(DEDUP.format(names=_names(plain)))
        fix.append(FIX_DEDUP)
        where = where or next((placed[n] for n in sorted(plain) if placed.get(n)), "")
    if outside:
        why.append(OUTSIDE.format(names=_names(outside)))
        fix.append(FIX_OUTSIDE)
        where = where or next((known.get("buffers", {}).get(n) for n in sorted(outside)
                               if known.get("buffers", {}).get(n)), "")
    output = max(r["output"] for r in records)
    if output > TOLERANCE:
        evidence.append(f"the fresh module's output, loaded, differs from the saved one's by {output:.1e}")
    errors = sorted({r["load_error"] for r in records if r["load_error"]})
    evidence += [f"load_state_dict said: {e}" for e in errors]
    saved_as = ("torch.save of model.state_dict(), load_state_dict(torch.load(...)) into a fresh "
                "module" if how == "torch.save" else "torch.distributed.checkpoint.save of "
                "model.state_dict(), dcp.load into a fresh module's, then load_state_dict")
    return Finding("error", "checkpoint-round-trip-lost", lesson,
                   "what was saved does not come back from the checkpoint",
                   evidence + why + [saved_as], fix="; ".join(fix), where=where)


def sites(model) -> dict:
    """What the parent knows about the user's lines: the state-dict hooks ({module name: (the
    hook's line storing a tensor into the state dict, or "", the line registering it)}) and the
    lines registering non-persistent buffers."""
    persistent = set(model.state_dict())
    return {"hooks": {n: (_hook_store(m), line_in_class(m, HOOK))
                      for n, m in model.named_modules() if m._state_dict_hooks},
            "buffers": {n: _buffer_site(model, n) for n, _ in model.named_buffers()
                        if n not in persistent}}


def _hook_store(module) -> str:
    for hook in module._state_dict_hooks.values():
        fn = getattr(hook, "func", hook)  # a functools.partial
        fn = getattr(fn, "__func__", fn)  # a bound method
        found = line_in_function(fn, STORE)
        if found:
            return found
    return ""


def _buffer_site(model, name: str) -> str:
    """The line registering buffer `name` ("a.b.stats"), found in its module's class."""
    owner, _, short = name.rpartition(".")
    try:
        module = model.get_submodule(owner)
    except AttributeError:
        return ""
    return line_in_class(module, re.compile(r"register_buffer\(\s*['\"]" + re.escape(short) + "['\"]"))


def judge(ev: Evidence) -> list[Finding]:
    """`ev.ranks`: every rank's record holding "round_trip" (one record for DDP's torch.save,
    in the doctor's process), or "round_trip_error" when it could not run; `ev.subject.source`
    the module; `ev.where` its code map; rank 0's "placed": {parameter: (file, line, function)}
    of the lines that split it."""
    failed = next((r["round_trip_error"] for r in ev.ranks if r and r.get("round_trip_error")), "")
    if failed:  # e.g. a forward that needs a process group: said, not guessed
        return [Finding("info", "checkpoint-round-trip-not-run", "09", "the checkpoint round "
                        "trip did not run", [f"one step of the module in this process raised "
                                             f"{failed}"])]
    trips = [(r or {}).get("round_trip") for r in ev.ranks]
    if not trips or not all(trips):
        return []
    placed = (ev.ranks[0] or {}).get("placed", {})
    known = sites(ev.subject.source.build())
    return round_trip_findings(trips, known, {n: site_line(*s, ev.where) for n, s in placed.items()})


CHECK = Check(
    name="roundtrip", mechanism="a checkpoint saved as users save it (torch.save under DDP, "
    "torch.distributed.checkpoint split or sharded) and loaded into a fresh module",
    lesson="16", codes={"checkpoint-round-trip-lost": "error",
                                "checkpoint-round-trip-not-run": "info"}, judge=judge, tools=("doctor",),
    tests="tests/doctor/checks/test_roundtrip.py",
    notes=("the module's state dict only: the optimizer's state, RNG states and the data "
           "position are the training loop's, not the module's",))
