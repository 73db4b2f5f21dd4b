"""The function API's own findings (the registry's checks, ddp_lab/doctor/checks, serve it as
they serve a script): dropout masks and initial weights, sharded reads outside forward, ZeRO-3's
reload and the evaluation, built in the parent from what each rank wrote after each step."""
from __future__ import annotations

from ..report import Finding


def steps_of(rec: dict) -> list[dict]:
    return [rec[k] for k in sorted((k for k in rec if k.startswith("step")), key=lambda k: int(k[4:]))]


def random_findings(recs: list[dict], strategy: str) -> list[Finding]:
    """Check 2: dropout masks differ between ranks; the initial weights agree (FSDP2)."""
    out = []
    per_rank = [steps_of(r) for r in recs]
    for step in range(min(map(len, per_rank), default=0)):
        masks = [s[step].get("masks", {}) for s in per_rank]
        same = [n for n in masks[0] if len({m.get(n) for m in masks}) == 1]
        if same and len(recs) > 1:
            out.append(Finding(
                "warning", "dropout-masks-identical-across-ranks", "14",
                f"dropout drops the same positions on every rank (step {step})",
                [f"identical masks on all {len(recs)} ranks: {', '.join(same[:4])}",
                 "the ranks' generators are in the same state: torch starts every process with "
                 "the same seed, and a torch.manual_seed(seed) on every rank keeps them equal"],
                fix="after building the model (same seed, same weights), seed the rest per rank: "
                    "torch.manual_seed(seed + rank)"))
            break
    inits = [r.get("init") for r in recs]
    if strategy == "fsdp2" and all(inits) and any(i != inits[0] for i in inits):
        differ = [n for n in inits[0] if len({i.get(n) for i in inits}) > 1]
        out.append(Finding(
            "warning", "initial-weights-differ", "14",
            "the ranks built different initial weights, and FSDP2 does not broadcast them",
            [f"differ: {', '.join(differ[:4])}", "each rank keeps its own shard of its own "
             "initialisation: a pretrained load done on one rank only is lost"],
            fix="seed the model's construction identically on every rank (or load the weights on "
                "every rank) before fully_shard", strategies=("fsdp2",)))
    return out


def read_findings(recs: list[dict], strategy: str) -> list[Finding]:
    """Check 4: parameters read outside forward under sharding, with the user's line."""
    reads = {}
    for rank, rec in enumerate(recs):
        for step, s in enumerate(steps_of(rec)):
            for name, what, where in s.get("reads", []):
                reads.setdefault((name, where), (rank, step, what))
    if not reads:
        return []
    zero3 = strategy == "zero3"
    ev = [f"{name}, rank {rank}, step {step}: {what}; read at {where or 'a line outside your files'}"
          for (name, where), (rank, step, what) in list(reads.items())[:6]]
    return [Finding(
        "error" if zero3 else "info", "sharded-read-outside-forward", "12",
        f"the step reads {len(reads)} sharded parameter(s) outside forward", ev
        + (["outside forward ZeRO-3 leaves an empty placeholder: what is computed from it is "
            "computed from nothing (a norm of 0.0, an empty copy; a gradient through it fails "
            "in backward)"] if zero3 else
           ["outside forward FSDP2 keeps only this rank's shard (a DTensor): ops on it are "
            "collectives every rank must run, and .to_local() is one shard"]),
        fix=("read weights inside forward, or inside deepspeed.zero.GatheredParameters(params)"
             if zero3 else "read weights inside forward, or weight.full_tensor() on every rank"),
        strategies=("zero3",) if zero3 else ("fsdp2",))]


def reload_findings(rec0: dict) -> list[Finding]:
    """Check 5: the saved checkpoint reloads into the plain module with the same values."""
    r = rec0.get("reload")
    if not r or r.get("ok"):
        return []
    ev = ([f"the plain module's load_state_dict said: {r['error'][:400]}"] if "error" in r else
          [f"{r['differs']} reloads off by {r['off']:.3g} from the trained model's value"])
    return [Finding(
        "error", "checkpoint-does-not-reload", "09",
        "the saved checkpoint does not reload into the plain module with the trained values", ev,
        fix="save the plain module's state: model.module.state_dict() under DDP; under FSDP2 "
            "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)); under "
            "ZeRO-3 engine.save_16bit_model or the state gathered with GatheredParameters")]


def evaluate_findings(recs: list[dict]) -> list[Finding]:
    """The values `evaluate` returns agree across ranks (each evaluated its own batch: a value
    that differs is one rank's data only, whichever rank logs it)."""
    values = [r.get("evaluate") for r in recs]
    if len(values) < 2 or not all(values):
        return []
    differ = [k for k in values[0] if len({round(v.get(k, float("nan")), 6) for v in values}) > 1]
    if not differ:
        return []
    return [Finding(
        "warning", "evaluation-differs-between-ranks", "14",
        f"evaluate returns different {', '.join(differ[:3])} on different ranks",
        [f"{k}: " + ", ".join(f"rank {r} {v[k]:.4g}" for r, v in enumerate(values)) for k in differ[:3]]
        + ["each rank evaluated its own share of the data: the value rank 0 logs is its share's"],
        fix="sum the counts (correct, total, loss sums) over the ranks with all_reduce, then divide; "
            "under DistributedSampler padding, count only the real samples")]
