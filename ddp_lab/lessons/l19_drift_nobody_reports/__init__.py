"""Lesson 19: drift nobody reports -- a model changed after DDP wrapped it, a trainer that wraps
it in one phase and not the next, gradients clipped by a per-rank norm under tensor parallelism,
an all_gather of per-rank lengths, an async result read before `wait()`. None of them raises an
error where the harm is done; each is made visible by a measurement across ranks.

`modules` holds the modules, `runs*` what each rank runs, `figures` the pictures."""
from __future__ import annotations

import math

from ...course.registry import Expect, Lesson, Scenario, Variant
from .figures import figures
from .modules import Block, Net
from .runs import (batch, cast_with_swap, change, digest, drift, step_through, train_changed,
                   train_phases, unregistered, watch_batches)
from .runs_collectives import (gather_objects, gather_on_gloo, gather_own_size, gather_padded,
                               gather_predictions, predictions, read_async, read_async_on_gloo)
from .runs_tp import (MAX_NORM, clip, global_norm, is_sharded, local, local_norm, train_clipped,
                      whole_norm)

__all__ = ["LESSON", "Block", "Net", "batch", "cast_with_swap", "change", "clip", "digest", "drift",
           "figures", "gather_objects", "gather_on_gloo", "gather_own_size", "gather_padded",
           "gather_predictions", "global_norm", "is_sharded", "local", "local_norm", "MAX_NORM",
           "predictions", "read_async", "read_async_on_gloo", "step_through", "train_changed",
           "train_clipped", "train_phases", "unregistered", "watch_batches", "whole_norm",
           "GLOO_SIZE_MISMATCH"]

# gloo's own check (third_party/gloo/gloo/transport/tcp/pair.cc in this build), printed by the
# rank it aborts: a rank that receives more bytes than its buffer holds. NCCL has no such check:
# a size-mismatched collective may hang there, or return garbage.
GLOO_SIZE_MISMATCH = "Received data size doesn't match expected size"


def _digests(agree: bool):
    def extra(result) -> list[str]:
        seen = result.values[0]["digests_agree"]
        ok = all(seen) if agree else not any(seen[1:])
        return [] if ok else [f"parameter digests agree across ranks per step: {seen}"]
    extra.condition = ("the ranks' parameter digests agree after every step" if agree else
                       "the ranks' parameter digests differ after every step from the second")
    return extra


def _unregistered(names: list[str]):
    def extra(result) -> list[str]:
        found = result.values[0]["unregistered"]
        return [] if found == names else [f"parameters DDP does not know: {found}, expected {names}"]
    extra.condition = f"the parameters DDP does not know are {names or 'none'}"
    return extra


def _gloo_abort(result) -> list[str]:
    """Rank 0 printed gloo's size check before SIGABRT."""
    r = result.ranks[0]
    return [] if GLOO_SIZE_MISMATCH in r.stderr else [f"rank 0's stderr lacks {GLOO_SIZE_MISMATCH!r}"]


def _every_rank_exact(result) -> list[str]:
    """Every rank assembled every rank's predictions exactly."""
    return [f"rank {r.rank}: error {r.value['error']}" for r in result.ranks if r.value["error"] != 0]


def _factors_differ(result) -> list[str]:
    """The ranks' clip factors differ by more than 1% in some step."""
    a, b = (v["factors"] for v in result.values[:2])
    gap = max(abs(x - y) / y for x, y in zip(a, b))
    return [] if gap > 0.01 else [f"the ranks' clip factors differ by up to {gap:.2%} only"]


def _clipped_by_whole_norm(result) -> list[str]:
    """Every rank clips by the norm of the whole gradient (within 1e-9, relative: a norm that
    merely agrees across ranks is not enough), so the clip factors are equal in every step."""
    problems = []
    for r in result.ranks:
        for step, (got, whole) in enumerate(zip(r.value["norms"], r.value["whole_norms"]), 1):
            if abs(got - whole) > 1e-9 * whole:
                problems.append(f"rank {r.rank} clipped by a norm of {got:.6g} at step {step}; the "
                                f"whole gradient's norm is {whole:.6g} ({got / whole - 1:+.2%})")
                break
    a, b = (v["factors"] for v in result.values[:2])
    if a != b:
        gap = max(abs(x - y) / y for x, y in zip(a, b))
        problems.append(f"the ranks' clip factors differ, by up to {gap:.1%}")
    return problems


FINISHED_FIRST = Variant(train_changed, Expect("ok", metric="drift", below=1e-9,
                                               extra=_unregistered([])),
                         kwargs={"what": "head", "wrap_first": False})

LESSON = Lesson(
    id="19",
    title="Drift nobody reports",
    notebook="19_drift_nobody_reports",
    error_class="silent divergence across ranks",
    figures=figures,
    scenarios=[
        # measured: 0.08 to 0.10 apart after each of 4 steps (torch 2.13, 2.14.1)
        Scenario("cast_after_wrapping", "model.double() after DDP(model): the ranks drift apart",
                 broken=Variant(train_changed, Expect("ok", metric="drift", above=1e-2,
                                                      extra=_digests(False)),
                                kwargs={"what": "cast", "wrap_first": True}),
                 fixed=Variant(train_changed, Expect("ok", metric="drift", below=1e-9,
                                                     extra=_digests(True)),
                               kwargs={"what": "cast", "wrap_first": False}),
                 summary="no error, no warning: the gradients are no longer averaged after the "
                         "cast; cast (or move) the model first, then wrap it"),
        Scenario("head_after_wrapping", "A head replaced after wrapping, find_unused_parameters=True",
                 broken=Variant(train_changed, Expect("ok", metric="drift", above=1e-2,
                                                      extra=_unregistered(["head.weight", "head.bias"])),
                                kwargs={"what": "head", "wrap_first": True,
                                        "find_unused_parameters": True}),
                 fixed=FINISHED_FIRST,
                 summary="DDP listed the parameters when it wrapped the model: the new head's "
                         "gradients are never averaged, and find_unused_parameters=True keeps "
                         "it silent; finish the model, then wrap"),
        Scenario("head_after_wrapping_default", "A head replaced after wrapping, default DDP",
                 broken=Variant(train_changed, Expect("error", "RuntimeError",
                                                      "Expected to have finished reduction in the "
                                                      "prior iteration", ranks=(0, 1)),
                                kwargs={"what": "head", "wrap_first": True}),
                 fixed=FINISHED_FIRST,
                 summary="the old head's parameters never get a gradient, so DDP's reducer "
                         "refuses the second step; finish the model, then wrap"),
        Scenario("wrapped_some_phases", "Phase 2 trains the bare module, not the DDP wrapper",
                 broken=Variant(train_phases, Expect("ok", metric="drift", above=1e-2),
                                kwargs={"wrapped_in_phase_2": False}),
                 fixed=Variant(train_phases, Expect("ok", metric="drift", below=1e-6),
                               kwargs={"wrapped_in_phase_2": True}),
                 summary="a forward through ddp.module (or a model never re-wrapped) runs no "
                         "all-reduce: each rank steps on its own gradient; train every phase "
                         "through the wrapper"),
        Scenario("clip_mixed_dtensor", "clip_grad_norm_ over tensor-parallel and plain parameters",
                 broken=Variant(train_clipped, Expect("error", "RuntimeError",
                                                      "got mixed torch.Tensor and DTensor",
                                                      ranks=(0, 1)),
                                kwargs={"norm": "clip_grad_norm_"}),
                 fixed=Variant(train_clipped, Expect("ok", metric="drift", below=1e-9,
                                                     extra=_clipped_by_whole_norm),
                               kwargs={"norm": "global"}),
                 summary="DTensor refuses a norm over DTensor and plain gradients together; "
                         "compute the global norm yourself (sharded squares all-reduced, "
                         "replicated ones once)"),
        # Related to, not the same as, the bug DeepSpeed's bf16 optimizer had while pull request
        # 1801 ("bf16+pipeline parallelism") was written: BF16_Optimizer.step clipped the list it
        # took the global norm of, which on tensor-parallel ranks above 0 leaves out parameters
        # that are not model-parallel (counted once, on rank 0), so those ranks did not clip the
        # replicated gradients; commit e24814a ("Also clip all tp rank parameters", 2022-03-24)
        # clipped them too, before the merge (56c5223, deepspeed/runtime/bf16_optimizer.py,
        # get_grads_for_norm(for_clipping=True)). Here: each rank clips by its own norm.
        Scenario("clip_local_norm", "Clipping each rank by the norm of its own shards",
                 broken=Variant(train_clipped, Expect("ok", metric="drift", above=1e-4,
                                                      extra=_factors_differ),
                                kwargs={"norm": "local"}),
                 fixed=Variant(train_clipped, Expect("ok", metric="drift", below=1e-9,
                                                     extra=_clipped_by_whole_norm),
                               kwargs={"norm": "global"}),
                 summary="each rank clips by a different factor, so the replicated LayerNorm "
                         "drifts apart (a relative of the bug DeepSpeed's bf16 optimizer had "
                         "while pull request 1801 was written); clip by the whole gradient's norm"),
        Scenario("uneven_all_gather", "all_gather of per-rank lengths into buffers of one's own",
                 # gloo's behaviour: rank 0 receives more than its buffer holds and gloo aborts
                 # it (SIGABRT); rank 1 returns with a wrong slot or loses its peer (both seen).
                 # NCCL has no such check: it may hang or return garbage instead.
                 broken=Variant(gather_on_gloo, Expect("crashed", match="SIGABRT", ranks=(0,),
                                                           extra=_gloo_abort),
                                kwargs={"how": "own_size"}, timeout=20, grace=2,
                                init_process_group=False),
                 fixed=Variant(gather_on_gloo, Expect("ok", extra=_every_rank_exact),
                               kwargs={"how": "padded"}, init_process_group=False),
                 summary="a collective's sizes must agree on every rank; gather the lengths, "
                         "pad to the longest, trim (or all_gather_object, which pickles)"),
        Scenario("read_before_wait", "An async all_reduce read before wait()",
                 # both variants on a gloo group of their own (runs_collectives.gloo_group)
                 broken=Variant(read_async_on_gloo, Expect("ok", metric="error", above=1),
                                init_process_group=False),
                 fixed=Variant(read_async_on_gloo, Expect("ok", metric="error", below=1e-9),
                               kwargs={"wait_first": True}, init_process_group=False),
                 summary="async_op=True returns at once: the tensor holds the sum only after "
                         "work.wait(); read it after"),
    ],
)
