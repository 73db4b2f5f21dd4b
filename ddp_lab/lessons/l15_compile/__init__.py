"""Lesson 15: custom modules under torch.compile with DDP and FSDP2 -- DDPOptimizer's graph per
bucket, recompiles from Python state, ranks that compile different graphs, checkpointing with a
side effect, and FSDP2 compiled whole or per block.

Every run compiles with `aot_eager` (dynamo + AOTAutograd, eager kernels): graphs, guards,
recompiles and DDPOptimizer's splits are inductor's, compiling gains nothing. What is pinned
here is torch 2.13's behaviour; each Expect that pins one says so.

`modules` holds the modules, `runs` / `runs_fsdp` what each rank runs, `figures` the picture.
"""
from __future__ import annotations

import os

from ...launching.sanitize import sanitize
from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from ..l12_sharded_modules.modules import TiedLM, TiedLMFixed
from .figures import figures
from .modules import (CheckpointedNet, LoggedBlock, LoggedBlockFixed, TokenNet, Tower, WarmupGate,
                      WarmupGateFixed, WarmupNet, checkpointed_net, checkpointed_net_fixed, features,
                      warmup_net, warmup_net_fixed)
from .runs import (COMPILER_MODULES, MAX_LEN, lengths, token_batches, train_buckets,
                   train_checkpointed, train_ragged, train_warmup)
from .runs_fsdp import train_sharded

TIMEOUT = 300.0  # no scenario here hangs; a first compile on a 2-core machine shared by other
# jobs (load average 15) was seen to take a minute
DDP_SPLIT = "DDPOptimizer intentional graph-break"
MIXED = r"got mixed torch\.Tensor and DTensor"


def prepare() -> None:
    """Before the lesson's scenarios (the tour, the tests and the notebook call it): the fork
    server imports what a rank's first torch.compile imports, once, so each rank compiles in
    well under a second instead of paying the compiler's imports."""
    from ...launching import prewarm

    prewarm(modules=list(COMPILER_MODULES))


def recompile_log(rank_result) -> list[str]:
    """What `TORCH_LOGS=recompiles` printed on a rank (CompileWatch turns it on), one entry per
    recompile, without the log's prefix (time, pid) or dynamo's frame ids ("4/0"), paths
    shortened: deterministic text."""
    import re

    entries: list[str] = []
    for line in rank_result.stderr.splitlines():
        if "[__recompiles]" not in line:
            continue
        text = re.sub(r"\b\d+/\d+: ", "", line.split("[__recompiles]", 1)[1][1:])
        if text.startswith("Recompiling function"):
            entries.append(text)
        elif entries:
            entries[-1] += "\n" + text
    return [sanitize(e) for e in entries]


def every_rank(check):
    """An Expect check: `check(value)` -> problem or "" on every rank."""
    def run(result) -> list[str]:
        return [f"rank {r.rank}: {p}" for r in result.ranks if r.value and (p := check(r.value))]
    return run


def _one_graph(v) -> str:
    return "" if v["graphs"] == 1 else f"{v['graphs']} graphs, expected 1"


def _split(v) -> str:
    if v["graphs"] < 2 or not any(DDP_SPLIT in r for r in v["split_reasons"]):
        return f"{v['graphs']} graph(s), reasons: {v['split_reasons']}; expected DDPOptimizer's split"
    return ""


def _guard_on_counter(v) -> str:
    first = (v["recompiles"] or [{}])[0]
    where = first.get("where", "")
    from . import modules

    # "l15_compile/modules.py", from the module itself (a path written out breaks when it moves)
    file = __name__.rpartition(".")[2] + "/" + os.path.basename(modules.__file__)
    if "calls == " not in first.get("guard", "") or file not in where:
        return f"first recompile {first}, expected a guard on .calls naming {file}"
    return ""


def _rank0_never_recompiles(result) -> list[str]:
    n = result.ranks[0].value["recompiles_after_first"] if result.ranks[0].value else None
    return [] if n == 0 else [f"rank 0 recompiled {n} time(s), expected 0"]


def _side_effect_named(v) -> str:
    if not any("side effect" in b["reason"] and b["where"].endswith("in mlp") for b in v["user_breaks"]):
        return f"no side-effect graph break in mlp: {v['user_breaks']}"
    return ""


WARMUP_CASE = ModuleCase(warmup_net, warmup_net_fixed, features, compile=True)
CHECKPOINT_CASE = ModuleCase(checkpointed_net, checkpointed_net_fixed, features, compile=True)

LESSON = Lesson(
    id="15",
    error_class="custom modules under torch.compile",
    title="Custom modules under torch.compile with DDP and FSDP2",
    notebook="15_compile",
    figures=figures,
    prepare=prepare,
    scenarios=[
        Scenario(
            "one_graph_no_overlap", "One graph by turning DDPOptimizer off",
            # torch 2.13: optimize_ddp=True (the default) hands the backend one graph per DDP
            # bucket (torch/_dynamo/backends/distributed.py, DDPOptimizer.compile_fn).
            broken=Variant(train_buckets, timeout=TIMEOUT, kwargs={"optimize_ddp": False},
                           expect=Expect("ok", metric="backward_before_first_bucket", above=0.99,
                                         metric_rank=None, extra=every_rank(_one_graph))),
            fixed=Variant(train_buckets, timeout=TIMEOUT,
                          expect=Expect("ok", metric="backward_before_first_bucket", below=0.75,
                                        metric_rank=None, extra=every_rank(_split))),
            summary="with optimize_ddp=False the whole backward is one compiled graph and DDP's "
                    "first all-reduce waits for all of it; keep DDPOptimizer's graph per bucket"),
        Scenario(
            "recompile_every_step", "A Python counter in forward: a new graph every step",
            # torch 2.13: dynamo guards on int attributes of a module (EQUALS_MATCH, with the hint
            # in torch/_dynamo/variables/builder.py); recompile_limit is 8.
            broken=Variant(train_warmup, timeout=TIMEOUT, expect=Expect(
                "ok", metric="recompiles_after_first", above=2.5, extra=lambda r: (
                    every_rank(_guard_on_counter)(r)
                    + every_rank(lambda v: "" if v["recompiles_after_first"] >= 3 else
                                 f"{v['recompiles_after_first']} recompiles in 4 steps")(r)))),
            fixed=Variant(train_warmup, timeout=TIMEOUT, kwargs={"gate_cls": WarmupGateFixed},
                          expect=Expect("ok", metric="recompiles_after_first", below=0.5,
                                        metric_rank=None)),
            module=WARMUP_CASE,
            summary="self.calls += 1 is a constant of the graph: each step fails the guard and "
                    "recompiles; keep the counter in a tensor buffer"),
        Scenario(
            "ranks_compile_different_graphs", "Ranks whose batches have different lengths",
            # torch 2.13 defaults: dynamic=None (automatic dynamic: a size that changes makes one
            # recompile, to a dynamic graph); DDP's collectives run outside the compiled graphs.
            broken=Variant(train_ragged, timeout=TIMEOUT, expect=Expect(
                "ok", metric="recompiles_after_first", metric_rank=1, above=0.5,
                extra=_rank0_never_recompiles)),
            fixed=Variant(train_ragged, timeout=TIMEOUT, kwargs={"pad": True},
                          expect=Expect("ok", metric="recompiles_after_first", below=0.5,
                                        metric_rank=None)),
            summary="rank 1 recompiles while rank 0 waits in DDP's all-reduce; pad every rank's "
                    "batch to one length (or mark the length dynamic on every rank)"),
        Scenario(
            "checkpoint_side_effect", "A side effect inside a checkpointed function",
            # torch 2.13: "HOP: Unsafe side effect" -- dynamo runs the checkpoint uncompiled
            broken=Variant(train_checkpointed, timeout=TIMEOUT, expect=Expect(
                "ok", metric="user_break_count", above=0.5, extra=every_rank(_side_effect_named))),
            fixed=Variant(train_checkpointed, timeout=TIMEOUT,
                          kwargs={"build": checkpointed_net_fixed},
                          expect=Expect("ok", metric="user_break_count", below=0.5,
                                        metric_rank=None)),
            module=CHECKPOINT_CASE,
            summary="self.last = h inside the checkpointed function breaks the graph and the "
                    "blocks run uncompiled; keep side effects outside the checkpoint"),
        Scenario(
            "fsdp2_tie_compiled", "FSDP2 compiled whole: a weight read outside its unit",
            # torch 2.13: dynamo's fake-tensor run raises the DTensor error at trace time
            broken=Variant(train_sharded, timeout=TIMEOUT, expect=Expect(
                "error", "TorchRuntimeError", MIXED, ranks=(0, 1))),
            fixed=Variant(train_sharded, timeout=TIMEOUT, kwargs={"model_cls": TiedLMFixed},
                          expect=Expect("ok", metric="graphs", above=1.5, metric_rank=None)),
            summary="compiled whole, the tie read fails while dynamo traces (TorchRuntimeError), "
                    "per block it fails eagerly as in lesson 12; keep the tie inside one unit"),
    ],
)

__all__ = ["LESSON", "CheckpointedNet", "LoggedBlock", "LoggedBlockFixed", "TiedLM", "TiedLMFixed",
           "TokenNet", "Tower", "WarmupGate", "WarmupGateFixed", "WarmupNet", "checkpointed_net",
           "checkpointed_net_fixed", "features", "warmup_net", "warmup_net_fixed", "COMPILER_MODULES",
           "MAX_LEN", "lengths", "token_batches", "train_buckets", "train_checkpointed",
           "train_ragged", "train_warmup", "train_sharded", "prepare", "every_rank", "figures",
           "recompile_log",
           "DDP_SPLIT", "TIMEOUT"]
