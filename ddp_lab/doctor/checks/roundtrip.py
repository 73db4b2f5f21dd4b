"""The checkpoint round trip's check, judged (doctor/roundtrip.py does the saving and loading
on the ranks, or in this process for DDP's torch.save): what did not come back, by how much,
and why; `where` is the user's line when it can be found (the line sharding a tensor by hand,
the state-dict hook's registration, the non-persistent buffer's)."""
from __future__ import annotations

from ..report import Finding
from ..roundtrip import TOLERANCE, sites, user_line
from . import Check

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


def judge_records(records: list[dict], source, where: dict | None = None,
                  placed: dict | None = None) -> list[Finding]:
    """The parent's side: one bare instance of the module tells the lines of its hooks and
    buffers; `placed` (rank 0's {parameter: (file, line, function)}) the lines that split it."""
    known = sites(source.build())
    return round_trip_findings(records, known, {n: user_line(*s, where) for n, s in
                                                (placed or {}).items()})


def torch_save_findings(source, example, where: dict | None = None) -> list[Finding]:
    """Under DDP, in this process: torch.save and load_state_dict (roundtrip.py)."""
    from ..roundtrip import torch_save_round_trip

    try:
        record = torch_save_round_trip(source, example)
    except Exception as exc:  # e.g. a forward that needs a process group: said, not guessed
        return [Finding("info", "checkpoint-round-trip-not-run", "09", "the checkpoint round "
                        "trip did not run", [f"one step of the module in this process raised "
                                             f"{type(exc).__name__}: {str(exc)[:200]}"])]
    return judge_records([record], source, where)


def judge(ev) -> list[Finding]:
    """`ev.ranks`: the ranks' records, each holding "round_trip"; `ev.source` the module."""
    trips = [r.get("round_trip") for r in ev.ranks if r]
    if not trips or not all(trips):
        return []
    placed = (ev.ranks[0] or {}).get("placed", {})
    return judge_records(trips, ev.source, getattr(ev, "where", None), placed)


CHECK = Check(
    name="roundtrip", mechanism="a checkpoint saved as users save it (torch.save under DDP, "
    "torch.distributed.checkpoint split or sharded) and loaded into a fresh module",
    lesson="16", codes={"checkpoint-round-trip-lost": "error",
                                "checkpoint-round-trip-not-run": "info"}, judge=judge, tools=("doctor",),
    strategies=("ddp", "fsdp2", "tp"), tests="tests/doctor/checks/test_roundtrip.py",
    notes=("the module's state dict only: the optimizer's state, RNG states and the data "
           "position are the training loop's, not the module's",))
