"""Lesson 05: gradients, retain_graph and checkpointing. State carried across steps (backward
twice, and what retain_graph=True costs), in-place edits of saved tensors, checkpointed regions
with side effects, reentrant checkpointing under DDP, and what checkpointing saves.

The modules are in `modules.py`, the per-rank code in `runs.py`, the memory measurements in
`memory.py`, the picture in `figures.py`.
"""
from __future__ import annotations

import re
from dataclasses import replace

from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from ...launching import sanitize
from . import modules as m
from .figures import draw_memory, figures
from .runs_memory import held_saved_bytes, peak_growth, reset_peak_rss, slope
from .runs import activation_memory, carry_state, checkpoint_grads, train_steps

__all__ = ["LESSON", "carry_state", "train_steps", "checkpoint_grads", "activation_memory",
           "held_saved_bytes", "peak_growth", "reset_peak_rss", "slope", "draw_memory",
           "anomaly_origin", "STATIC_GRAPH", "BACKWARD_TWICE", "INPLACE"]

BACKWARD_TWICE = r"Trying to backward through the graph a second time"
INPLACE = r"modified by an inplace operation"
SAME_GRADIENTS = Expect("ok", metric="grad_error", below=1e-6)
WRONG_GRADIENTS = Expect("ok", metric="grad_error", above=1e-3)
# MiB per step that autograd keeps holding, over the second half of the loop.
NO_GROWTH = Expect("ok", metric="held_growth", below=0.01)

DETACHED = Variant(carry_state, NO_GROWTH, kwargs={"model_cls": m.ContextNetFixed})


def _steps(model_cls, expect, **kwargs):
    return Variant(train_steps, expect, kwargs={"model_cls": model_cls, **kwargs}, grace=2)


def _grads(model_cls, expect, **kwargs):
    return Variant(checkpoint_grads, expect, kwargs={"model_cls": model_cls, **kwargs}, grace=2)


def _batch(rank):
    return m.example_batch(rank)


def anomaly_origin(stderr: str) -> str:
    """From a rank's stderr under `set_detect_anomaly(True)`: the backward node that failed and
    the innermost forward line that created it."""
    node = re.search(r"Error detected in (\w+)\. Traceback of forward call", stderr)
    trace = stderr[node.end():] if node else ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.+)', trace.split("(Triggered")[0])
    if not node or not frames:
        return "no anomaly report found"
    path, line, func, code = frames[-1]
    return sanitize(f"{node.group(1)} failed; the forward call that created its input:\n"
                    f"  {path}, line {line}, in {func}\n    {code.strip()}")


SHARED_BROKEN = _grads(m.SharedBlockNet, Expect("error", "RuntimeError",
                       r"Expected to mark a variable ready only once", ranks=(0, 1)))
# The other fix: keep reentrant checkpointing and tell DDP the graph is the same every step.
STATIC_GRAPH = replace(SHARED_BROKEN, expect=SAME_GRADIENTS).with_kwargs(
    ddp_options={"static_graph": True})

LESSON = Lesson(
    id="05",
    error_class="gradients and checkpointing",
    title="Gradients, retain_graph and checkpointing",
    notebook="05_gradients_and_checkpointing",
    figures=figures,
    scenarios=[
        Scenario("backward_twice", "State carried across steps: backward through it twice",
                 broken=Variant(carry_state, Expect("error", "RuntimeError", BACKWARD_TWICE,
                                                    ranks=(0, 1)),
                                kwargs={"model_cls": m.ContextNet}, grace=2),
                 fixed=DETACHED,
                 summary="the context kept from step 1 carries step 1's graph, freed by its "
                         "backward; detach what is carried (or recompute it each step)",
                 module=ModuleCase(m.ContextNet, m.ContextNetFixed, _batch)),
        Scenario("retain_graph", "retain_graph=True, the source document's fix",
                 broken=Variant(carry_state, Expect("ok", metric="held_growth", above=0.5),
                                kwargs={"model_cls": m.ContextNet, "retain_graph": True}),
                 fixed=DETACHED,
                 summary="the error goes, and every step's graph stays: memory grows by a step's "
                         "activations each step, and each backward runs through all past steps"),
        Scenario("retain_graph_weights", "retain_graph=True when the carried graph holds weights",
                 broken=_steps(m.RecurrentCell, Expect("error", "RuntimeError", INPLACE, ranks=(0, 1)),
                               retain_graph=True),
                 fixed=_steps(m.RecurrentCellFixed, Expect("ok", metric="drift", below=1e-6)),
                 summary="the old graph saved W; optimizer.step() changed W in place, so the next "
                         "backward through the old graph fails: detach the hidden state",
                 module=ModuleCase(m.RecurrentCell, m.RecurrentCellFixed, _batch)),
        Scenario("inplace_saved", "An in-place edit of a tensor autograd saved",
                 broken=_steps(m.AttentionPool, Expect("error", "RuntimeError", INPLACE, ranks=(0, 1))),
                 fixed=_steps(m.AttentionPoolFixed, Expect("ok", metric="drift", below=1e-6)),
                 summary="exp saves its output for backward; `weights /= ...` overwrites it: "
                         "divide out of place (or use torch.softmax)",
                 module=ModuleCase(m.AttentionPool, m.AttentionPoolFixed, _batch)),
        Scenario("checkpoint_side_effect", "A checkpointed region that appends to a list",
                 broken=_grads(m.MemoryNet, Expect("error", "CheckpointError",
                               r"Recomputed values for the following tensors have different metadata",
                               ranks=(0, 1))),
                 fixed=_grads(m.MemoryNetFixed, SAME_GRADIENTS),
                 summary="the recomputation appends again and sees a longer memory; "
                         "use_reentrant=False notices the shapes differ. Keep side effects outside",
                 module=ModuleCase(m.MemoryNet, m.MemoryNetFixed, _batch)),
        Scenario("checkpoint_counter", "A checkpointed region that counts its calls",
                 broken=_grads(m.WarmupNet, WRONG_GRADIENTS),
                 fixed=_grads(m.WarmupNetFixed, SAME_GRADIENTS),
                 summary="the recomputation counts one more call and uses another warm-up factor: "
                         "same shapes, so no error, only wrong gradients. Count outside the region",
                 module=ModuleCase(m.WarmupNet, m.WarmupNetFixed, _batch)),
        Scenario("checkpoint_rng", "Dropout in a region checkpointed with preserve_rng_state=False",
                 broken=_grads(m.DropoutNet, WRONG_GRADIENTS),
                 fixed=_grads(m.DropoutNetFixed, SAME_GRADIENTS),
                 summary="the recomputation draws a new dropout mask: gradients of a network that "
                         "never ran. Keep preserve_rng_state=True (the default)",
                 module=ModuleCase(m.DropoutNet, m.DropoutNetFixed, _batch)),
        Scenario("reentrant_ddp", "One block checkpointed twice, reentrant, under DDP",
                 broken=SHARED_BROKEN,
                 fixed=_grads(m.SharedBlockNetFixed, SAME_GRADIENTS),
                 summary="each reentrant recomputation runs its own backward and marks the shared "
                         "weights ready again: use_reentrant=False (or DDP(static_graph=True))",
                 module=ModuleCase(m.SharedBlockNet, m.SharedBlockNetFixed, _batch)),
        Scenario("activation_memory", "Activations held for backward grow with depth",
                 broken=Variant(activation_memory, Expect("ok", metric="saved_mb", above=20)),
                 fixed=Variant(activation_memory, Expect("ok", metric="saved_mb", below=10),
                               kwargs={"checkpointed": True}),
                 summary="every block keeps ~9 activations of the batch for backward; checkpointed, "
                         "it keeps its input and recomputes the rest in backward"),
    ],
)
