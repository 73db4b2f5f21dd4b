"""Lesson 10: gradient accumulation under DDP -- no_sync, the all-reduces it saves, and the loss
scaling that makes k micro-batches equal one large batch. The model is in `modules.py`, the
training loop and the `backward(model, micro_batches)` variants a learner writes in `runs.py`,
the picture in `figures.py`.
"""
from __future__ import annotations

from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import figures
from .modules import Net
from .runs import (CommCounter, accumulate_and_step, backward_every_micro_batch,
                   backward_no_sync_around_backward_only, backward_summing_losses,
                   backward_with_no_sync, counting_allreduce_hook, global_batch, reference_grads)

__all__ = ["LESSON", "GRAD_TOLERANCE", "K", "CommCounter", "Net", "accumulate_and_step",
           "backward_every_micro_batch", "backward_no_sync_around_backward_only",
           "backward_summing_losses", "backward_with_no_sync", "counting_allreduce_hook", "figures",
           "global_batch", "reference_grads"]

GRAD_TOLERANCE = 1e-5  # relative; float32 sums in a different order differ by ~1e-7


def _gradients_match(result) -> list[str]:
    return [f"rank {r.rank}: gradient off the large-batch reference by {r.value['grad_error']:.3g} "
            f"(relative), expected < {GRAD_TOLERANCE:g}"
            for r in result.ranks if r.ok and not r.value["grad_error"] < GRAD_TOLERANCE]


def _synchronised(result) -> list[str]:
    problems = _gradients_match(result)
    return problems + [f"rank {r.rank}: a step with no all-reduce: the ranks' gradients were "
                       "never averaged" for r in result.ranks
                       if r.ok and min(r.value["allreduces_per_step"]) < 1]


K = 4

LESSON = Lesson(
    id="10",
    error_class="gradient accumulation",
    title="Gradient accumulation and no_sync",
    notebook="10_gradient_accumulation",
    figures=figures,
    scenarios=[
        Scenario("no_sync", "Accumulating gradients without no_sync",
                 broken=Variant(accumulate_and_step, Expect("ok", metric="allreduces", above=K - 0.5,
                                                            extra=_gradients_match),
                                kwargs={"k": K}),
                 fixed=Variant(accumulate_and_step, Expect("ok", metric="allreduces", below=1.5,
                                                           extra=_synchronised),
                               kwargs={"k": K, "backward": backward_with_no_sync}),
                 summary=f"every backward all-reduces: {K} all-reduces per step for {K} "
                         "micro-batches; `with model.no_sync():` on all but the last makes it one"),
        Scenario("loss_scaling", "Micro-batch losses summed instead of averaged",
                 broken=Variant(accumulate_and_step, Expect("ok", metric="grad_error", above=0.5),
                                kwargs={"k": K, "backward": backward_summing_losses}),
                 fixed=Variant(accumulate_and_step, Expect("ok", metric="grad_error",
                                                           below=GRAD_TOLERANCE),
                               kwargs={"k": K, "backward": backward_with_no_sync}),
                 summary=f"without loss / k the accumulated gradient is {K}x the large-batch "
                         "gradient; divide each micro-batch's loss by k"),
    ],
)
