"""Which training strategy's rule each finding is (issue 24): a module that trains under FSDP2
may break a rule only DDP enforces, and the doctor judges it by the strategy the user trains
with. `Finding.strategies` comes from here; `judged_under` turns another strategy's error into
a note that says whose rule it is."""
from __future__ import annotations

EVERY = ("ddp", "fsdp2", "zero3")  # the training strategies the doctor judges a module under
NAMES = {"ddp": "DDP", "fsdp2": "FSDP2", "zero3": "ZeRO-3", "tp": "tensor parallel"}

# code -> the strategies whose rule the finding is; a code not listed applies to all of EVERY.
# A registry check declares its own (Check.strategies: checks/tp_parallelize.py's are "tp"); this
# table holds the codes of the doctor's phases.
# DDP-only, read in the sources (torch 2.13, DeepSpeed 0.19.8): "Expected to have finished
# reduction" and "marked ready twice" are raised by DDP's Reducer (csrc/distributed/c10d/
# reducer.cpp, in libtorch_cpu); FSDP2's FSDPParamGroup.post_backward reduce-scatters only the
# parameters whose .grad is set, and ZeRO-3 reduces each parameter from its own hook (stage3.py
# fills None gradients of leaf modules with zeros); "doesn't have any parameter that requires a
# gradient" is DDP's constructor. Parameters unused on SOME ranks stay an error everywhere:
# FSDP2's reduce-scatter then differs in size between ranks.
STRATEGIES_OF = {
    "unused-parameters": ("ddp",),
    "checkpoint-under-ddp": ("ddp",),
    "no-trainable-parameters": ("ddp",),
    "weight-shared-across-units": ("fsdp2",),
    "mixed-requires-grad": ("fsdp2",),
    "read-outside-its-unit": ("fsdp2", "zero3"),
    "sharded-run-failed": ("fsdp2", "zero3"),
    "bf16-table-error": ("fsdp2",),
    "tp-run-failed": ("tp",),  # the tensor-parallel launch failed (exam/tensor_parallel.py)
}
WHY_NOT = {  # code -> why the rule does not hold under another strategy
    "unused-parameters": "FSDP2 reduce-scatters only the parameters that received a gradient, "
                         "and ZeRO-3 reduces each parameter from its own hook",
    "checkpoint-under-ddp": "only DDP's reducer counts each parameter ready once per backward",
    "no-trainable-parameters": "only DDP's constructor refuses such a module",
}


# code -> (its own severity, why): a finding that only DDP's failure made an error. DDP
# broadcasts rank 0's buffers before each forward (DistributedDataParallel._sync_buffers,
# broadcast_buffers=True); fully_shard has no buffer broadcast (torch/distributed/fsdp/
# _fully_shard), and DeepSpeed's engine broadcasts parameters only, once (engine._broadcast_model).
RAISED_BY_DDP = {
    "state-shape-follows-input": ("warning", "the failure was DDP's broadcast of the buffers "
                                  "before forward; FSDP2 and ZeRO-3 broadcast no buffer, so each "
                                  "rank keeps its own"),
}


def strategies_of(code: str) -> tuple[str, ...]:
    return STRATEGIES_OF.get(code, EVERY)


def strategy_names(strategies) -> str:
    """"DDP only", "FSDP2, ZeRO-3", ... ("" for every strategy: nothing to say)."""
    if tuple(strategies) == EVERY:
        return ""
    names = ", ".join(NAMES.get(s, s) for s in strategies)
    return f"{names} only" if len(strategies) == 1 else names


def judged_under(findings: list, strategy: str) -> list:
    """Under `strategy`, an error that is another strategy's rule becomes a note saying so."""
    for f in findings:
        raised = RAISED_BY_DDP.get(f.code)
        if strategy in ("fsdp2", "zero3") and raised and f.severity == "error" and any(
                e.startswith("the run then failed") for e in f.evidence):
            f.severity = raised[0]
            f.evidence.append(f"DDP only: under {strategy} this is a {raised[0]} ({raised[1]})")
        elif strategy in EVERY and strategy not in f.strategies and f.severity == "error":
            why = WHY_NOT.get(f.code, "the rule does not apply to it")
            f.severity = "info"
            f.evidence.append(f"{strategy_names(f.strategies)}: under {strategy} this is not an "
                              f"error ({why})")
    return findings
