"""The doctor's tensor-parallel check (`strategy="tp"`), judged: the module split as the user
splits it (`parallelize=fn(model, mesh)`: parallelize_module and whatever they do after it; or
a plan: `tp_plan`, the module's own `tp_plan`) beside the same module whole, compared over
doctor/exam/tensor_parallel.py's STEPS SGD steps on the same batch. The ranks' records come from
doctor/exam/tensor_parallel.py's `probe`; this module turns one rank's record into findings.

Codes: an op without a DTensor sharding rule, a split that fails, outputs (or, with a plan,
gradients paired by name) that differ from the module whole, a tie the split broke ("head.weight
and embed.weight were one parameter before parallelising and are two after"), a plan that
leaves most bytes whole, and "tp-needs-plan" (info) when nothing says how to split."""
from __future__ import annotations

from ..userline import site_line
from .api import Check, Evidence, Finding

LESSON = "16"
WORDS = {2: "two", 3: "three", 4: "four"}
TOLERANCE = 1e-4  # relative; split and whole differ by float rounding only (about 1e-7)
WHOLE_SHARE = 0.5  # warn when more than this share of the parameter bytes is not split
NO_RULE = "does not have a sharding strategy registered"

FIX_RULE = ("give DTensor a sharding rule for the op (torch.distributed.tensor.experimental."
            "register_sharding), or hand the op local tensors: ColwiseParallel(use_local_output"
            "=True), the default, or local_map")
FIX_DIFFERS = ("a rank computes with its shard: derive sizes from the local shape (a head count: "
               "view(b, s, -1, head_dim), not view(b, s, heads, -1)); a reduction over a split "
               "dimension (a norm, a softmax, a loss) must see all of it: keep the DTensor "
               "(ColwiseParallel(use_local_output=False)) so DTensor all-reduces it; a fused "
               "weight (qkv, gate_up) split contiguously gives rank 0 all of q and part of k: "
               "interleave its rows per rank before splitting, or split q, k, v apart")
FIX_WHOLE = ("name them in the plan (an Embedding: RowwiseParallel(input_layouts=Replicate()); "
             "an output projection: ColwiseParallel(output_layouts=Replicate())), or shard the "
             "rest with FSDP2 over a second mesh dimension")
FIX_TIE = ("parallelize_module replaces each split module's parameters with new DTensor "
           "parameters (distribute_module's register_parameter, torch/distributed/tensor/_api.py:1148 in torch 2.13): tie them again "
           "after it, e.g. model.head.weight = model.embed.weight")
FIX_PLAN = ("give the plan: doctor(..., tp_plan={'up': 'colwise', 'down': 'rowwise'}), your own "
            "parallelize=fn(model, mesh), a tp_plan() method on the module, or tp_plan='traced' "
            "to pair its Linear layers colwise/rowwise by tracing one forward")


def _site(site, where) -> str:
    return site_line(*site, where) if site else ""


def findings(v: dict, world_size: int, where: dict | None) -> list[Finding]:
    if v.get("origin") == "none" and "error" not in v:
        return [Finding("info", "tp-needs-plan", LESSON, "tensor parallelism not checked: no plan",
                        ["you gave no tp_plan and no parallelize, and the module has no tp_plan "
                         "of its own: how to split a layer depends on its layout (a fused QKV "
                         "split contiguously mixes q, k and v), so the doctor does not guess"],
                        fix=FIX_PLAN)]
    plan_line = "plan (" + v["origin"] + ")" + (": " + ", ".join(
        f"{n}: {s}" for n, s in v["plan"].items()) if v["plan"] else "")
    out = [Finding("info", "tp-plan", LESSON, f"the module split over {world_size} ranks",
                   [plan_line, "the same batch on every rank; outputs and gradients compared "
                    "with the module whole over SGD steps"])]
    if "error" in v:
        rule = NO_RULE in v["error"]
        out.append(Finding("error", "op-without-sharding-strategy" if rule else "tp-run-failed",
                           LESSON, "an op of the module has no DTensor sharding rule" if rule
                           else "forward/backward fails with the module split",
                           [f"PyTorch said: {v['error']}", plan_line],
                           fix=FIX_RULE if rule else "", where=_site(v.get("error_at"), where)))
        return out
    ties, differs = _ties(v, where), _differs(v, plan_line, where)
    if ties and differs:  # the broken tie is why the outputs part: one finding, with both
        ties[0].evidence += differs[0].evidence[:-1]
        differs = []
    out += ties + differs
    if v["whole_share"] > WHOLE_SHARE and not v.get("parallelize"):
        out.append(Finding("warning", "plan-leaves-weights-whole", LESSON,
                           "most parameter bytes stay whole on every rank",
                           [f"{v['whole_share']:.0%} of the parameter bytes are not split: "
                            + ", ".join(v["whole_names"][:6])
                            + (" ..." if len(v["whole_names"]) > 6 else "")], fix=FIX_WHOLE))
    return out


def _last_site(v, names, where) -> str:
    sites = [v.get("placed", {}).get(n) for n in names]
    return next((_site(s, where) for s in reversed(sites) if s), "")


def _ties(v, where) -> list[Finding]:
    out = []
    for group in v.get("untied", []):
        first, rest = group[0], " and ".join(group[1:])
        out.append(Finding("error", "tp-tie-broken", LESSON, "a tied parameter is untied by the split",
                           [f"{rest} and {first} were one parameter before parallelising and are "
                            f"{WORDS.get(len(group), len(group))} after: each is trained on its own gradient"],
                           fix=FIX_TIE, where=_last_site(v, group, where)))
    return out


def _differs(v, plan_line, where) -> list[Finding]:
    errors = v["errors"]
    outputs = {k: e for k, e in errors.items() if k.startswith("output")}
    grads = sorted(((k, e) for k, e in errors.items() if k not in outputs), key=lambda kv: -kv[1])
    # With the user's own parallelize a weight may be laid out anew (a fused QKV interleaved
    # per rank), so its gradient is not the whole one's: the outputs decide, gradients explain.
    bad = max(outputs.values(), default=0.0) > TOLERANCE or (
        not v.get("parallelize") and grads and grads[0][1] > TOLERANCE)
    if not bad:
        return []
    lines = [f"{what} differs by {err:.1e} (relative; tolerance {TOLERANCE:.0e})"
             for what, err in list(outputs.items()) + grads[:2] if err > TOLERANCE]
    split_at = _last_site(v, list(v.get("placed", {})), where)
    return [Finding("error", "tp-output-differs", LESSON,
                    "split, the module computes something else than whole", lines + [plan_line],
                    fix=FIX_DIFFERS, where=split_at)]


def judge(ev: Evidence) -> list[Finding]:
    """`ev.ranks`: the ranks' probe records (rank 0's is judged: every rank computes the same);
    every finding is tensor parallel's rule (CHECK.strategies)."""
    ranks = [r for r in ev.ranks if r]
    if not ranks:
        return []
    return findings(ranks[0], ev.world_size, ev.where)


CHECK = Check(
    name="tp_parallelize", mechanism="tensor parallelism as the user splits the module "
    "(parallelize= or a plan) against the module whole, over SGD steps", lesson=LESSON,
    codes={"tp-output-differs": "error", "tp-tie-broken": "error",
           "op-without-sharding-strategy": "error", "tp-run-failed": "error",
           "plan-leaves-weights-whole": "warning", "tp-plan": "info", "tp-needs-plan": "info"},
    judge=judge, tools=("doctor",), strategies=("tp",),
    tests="tests/doctor/checks/test_tp_parallelize.py",
    notes=("one batch, the same on every rank; the split compared only where the user gives a "
           "plan or a parallelize function",))
