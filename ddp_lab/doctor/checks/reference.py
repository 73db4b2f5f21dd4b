"""Watch check "reference" (issue 45): does this distributed run train what one process would on the
same global batch? Some of the costliest bugs agree on every rank (the loss divided by the world
size before backward, gradients all_reduced again on top of DDP's average, a learning rate sized
from the per-rank batch, a statistic over the rank's own batch where the method means the global
one): no cross-rank invariant breaks; they differ only from the one-process run.

`ddp-lab watch --reference` (watch/reference_run.py) runs the script twice, unchanged: at world size
N as usual, then as the reference, one process for the first K optimizer steps, fed the global
batch of each step (the union of the ranks' batches: _reference_data.py). This check is attached
to both runs only then (the environment variable ENV says its role; without it, it adds nothing to
a rank). On each side it records the batches' rows, the DataLoaders and where their batch size
comes from, the optimizers' and schedulers' lines, the script's all_reduce of a `.grad`, and the
model's tensors (_reference_tensors.py: the distributed run writes them to the run's folder, the
reference compares its own with them there); the line trace (_reference_trace.py) finds the first
line whose rows part. In the parent (_reference_judge.py): the steps whose data agree are
compared, in the order training makes them: the loss the criterion computed, each parameter's
gradient, the learning rate, each parameter's update; the first step and tensor where the runs
part, by how much, and the line that makes the difference where one mechanism says so.
"""
from __future__ import annotations

import json
import os

from ._reference_data import Data
from ._reference_hooks import attach as attach_hooks
from ._reference_judge import judge
from ._reference_notes import notes  # noqa: F401 - watch/reference_run.py puts them in the report
from ._reference_tensors import Tensors
from ._reference_trace import Trace
from .api import Check

ENV = "DDP_LAB_REFERENCE"  # JSON: {role: watched|reference, dir, steps, world, plan}


def config() -> dict | None:
    """This rank's role in a run with --reference, or None (a plain watch run)."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    cfg = json.loads(raw)
    return cfg if cfg.get("role") in ("watched", "reference") and cfg.get("dir") else None


def attach(ctx) -> None:
    cfg = config()
    if cfg is None:
        return
    shared: dict = {}
    tensors = Tensors(ctx, cfg)
    Data(ctx, cfg, shared).attach()
    tensors.attach()
    attach_hooks(ctx, int(cfg.get("steps", 3)), lambda: list(
        tensors.model.module.named_parameters()) if tensors.model is not None else [], shared)
    Trace(ctx, cfg, shared).attach()
    if cfg["role"] == "reference":
        ctx.on_step_end(_stop_after(int(cfg.get("steps", 3))))


class ReferenceDone(SystemExit):
    """The reference's K steps are done: the script stops there, as sys.exit(0) would."""


def _stop_after(steps: int):
    def stop(ctx) -> None:
        if ctx.step >= steps - 1:
            raise ReferenceDone(0)  # a SystemExit: ctx.guard lets it through, run_path ends
    return stop


CHECK = Check(
    name="reference",
    mechanism="with --reference: the run against one process on the same global batch (the "
              "script unchanged at world size 1 for K steps): the loss, each gradient, the "
              "learning rate, each update; the first step and tensor that part, and the line",
    lesson="20",
    codes={"reference-differs": "warning", "reference-gradient-only": "info",
           "reference-explained": "info", "reference-global-batch": "warning"},
    attach=attach, judge=judge, tools=("watch",),
    tests=("tests/doctor/checks/test_reference.py", "tests/doctor/checks/test_reference_runs.py"),
    notes=("runs only with --reference (one more launch: one process for K steps, default 3)",
           "the global batch the job means is known only when declared (--global-batch G): "
           "then a step that trains on another number is a warning at the DataLoader",
           "the global batch comes from the script's DataLoaders: a script that makes its batches "
           "itself (torch.randn in the loop, hand-sliced tensors), a batch sampler of its own or "
           "data that differ per rank is refused with a note, never compared",
           "dropout is off in both runs for the compared steps; inside a compiled model it is "
           "left on and a parting is explained, not judged",
           "BatchNorm without SyncBatchNorm normalises each rank's batch: a parting is explained "
           "(info), not judged",
           "random numbers the step draws after its batch (noise on the inputs, a random mask) "
           "differ between the runs: a parting is explained (info), not judged",
           "a gradient near zero is weighed against the whole model's (a float sum's order is "
           "noise there)",
           "the first DDP model (or FSDP2's root) is compared, with the first optimizer that "
           "steps; a model over 50M parameters is not",
           "the line is named from one mechanism: the learning rate's construction, an "
           "all_reduce of .grad, the division of the loss before backward, or the first line "
           "whose batch-shaped tensor (rows first) holds rows one process does not"))
