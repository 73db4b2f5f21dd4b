"""Lesson 16: custom modules under tensor parallelism, and distributed checkpoints.

Tensor parallelism (`parallelize_module`) splits each weight of a block across ranks. A rank's
block then computes with its shard: a hard-coded head count or a reduction over the split
features goes silently wrong, and an op DTensor has no sharding rule for refuses to run. A
checkpoint of split weights must be read back by another number of ranks
(`torch.distributed.checkpoint`), with the module's non-tensor state (`Stateful`). A plan for
64 ranks is checked in one process with PyTorch's fake process group.
"""
from __future__ import annotations

from ...launching import prewarm as _prewarm
from ...course.registry import Expect, Lesson, ModuleCase, Scenario, Variant
from .figures import draw_memory, figures
from .modules import (Attention, AttentionFixed, GatedMLP, GatedMLPFixed, Noisy, NormedMLP,
                      NormedMLPFixed, TinyLM, TinyLMFixed, allow_sharded_swiglu, features,
                      swiglu, swiglu_rule, tiny_lm, tiny_lm_fixed, tokens)
from .runs import TOLERANCE, compare, memory_per_rank, mesh_of
from .runs_checkpoint import (NoisyState, load_dcp, load_per_rank, reshard, resume, save_dcp,
                              save_per_rank, weights_and_state, weights_only)
from .runs_simulated import (FAKE_API, SIZES, WRITTEN_FOR, fake_store, separate_meshes,
                             simulate, sliced_meshes)

__all__ = ["LESSON", "Attention", "AttentionFixed", "NormedMLP", "NormedMLPFixed", "GatedMLP",
           "GatedMLPFixed", "swiglu", "swiglu_rule", "allow_sharded_swiglu", "TinyLM",
           "TinyLMFixed", "tiny_lm", "tiny_lm_fixed", "Noisy", "NoisyState", "features",
           "tokens", "compare", "mesh_of", "memory_per_rank", "TOLERANCE", "reshard", "resume",
           "save_per_rank", "load_per_rank", "save_dcp", "load_dcp", "weights_only",
           "weights_and_state", "simulate", "separate_meshes", "sliced_meshes", "fake_store",
           "FAKE_API", "WRITTEN_FOR", "SIZES", "figures", "draw_memory", "prewarm"]

TIMEOUT = 120.0  # no scenario here hangs on purpose: a bound for a loaded machine, not a wait
NO_RULE = r"Operator ddp_lab\.swiglu\.default does not have a sharding strategy registered"
SIZE_MISMATCH = (r"size mismatch for emb\.weight: copying a param with shape "
                 r"torch\.Size\(\[512, 64\]\) from checkpoint, the shape in current model is "
                 r"torch\.Size\(\[1024, 64\]\)")
# FSDP2 joins its mesh and the parameters' tensor-parallel mesh into one (DeviceMesh._concatenate,
# torch/distributed/device_mesh.py in 2.13); meshes made separately cannot be joined. 2.13 spells
# it "meshs", 2.14 "meshes": both accepted.
NOT_ONE_MESH = r"Cannot concatenate DeviceMeshes derived from different device meshe?s"
# What the lesson's ranks import inside its functions (so the registry stays cheap to import).
HEAVY = ["torch.distributed.tensor.parallel", "torch.distributed.checkpoint",
         "torch.distributed.fsdp"]


def prewarm(wait: bool = False) -> bool:
    """Have the fork server import DTensor, tensor parallelism, DCP and FSDP2 once (about 2 s
    a rank otherwise), so each rank of the lesson starts warm."""
    return _prewarm(wait=wait, modules=HEAVY)


def _compare(broken, fixed, input_fn=features):
    return ModuleCase(broken, fixed, input_fn, strategy="tp")


LESSON = Lesson(
    id="16",
    error_class="tensor parallelism and distributed checkpoints",
    title="Custom modules under tensor parallelism, and distributed checkpoints",
    notebook="16_tensor_parallel_and_checkpoints",
    figures=figures,
    prepare=prewarm,
    scenarios=[
        Scenario("heads_per_rank", "An attention block's head count under ColwiseParallel",
                 broken=Variant(compare, Expect("ok", metric="rel_error", above=0.05,
                                                metric_rank=None),
                                kwargs={"model_cls": Attention}, timeout=TIMEOUT),
                 fixed=Variant(compare, Expect("ok", metric="rel_error", below=TOLERANCE,
                                               metric_rank=None),
                               kwargs={"model_cls": AttentionFixed}, timeout=TIMEOUT),
                 module=_compare(Attention, AttentionFixed),
                 summary="a rank holds heads/N of q's features; view(b, s, heads, -1) makes "
                         "thinner heads, silently; fix the head width: view(b, s, -1, head_dim)"),
        Scenario("local_reduction", "A norm over the hidden features, split by ColwiseParallel",
                 broken=Variant(compare, Expect("ok", metric="rel_error", above=0.01,
                                                metric_rank=None),
                                kwargs={"model_cls": NormedMLP}, timeout=TIMEOUT),
                 fixed=Variant(compare, Expect("ok", metric="rel_error", below=TOLERANCE,
                                               metric_rank=None),
                               kwargs={"model_cls": NormedMLPFixed}, timeout=TIMEOUT),
                 module=_compare(NormedMLP, NormedMLPFixed),
                 summary="a plain local output holds this rank's features: the mean is over "
                         "them only, silently; ColwiseParallel(use_local_output=False) keeps a "
                         "DTensor, whose mean is all-reduced"),
        Scenario("op_without_sharding", "A custom op of a block that receives DTensors",
                 broken=Variant(compare, Expect("error", "NotImplementedError", NO_RULE,
                                                ranks=(0, 1)),
                                kwargs={"model_cls": GatedMLP}, timeout=TIMEOUT),
                 fixed=Variant(compare, Expect("ok", metric="rel_error", below=TOLERANCE,
                                               metric_rank=None),
                               kwargs={"model_cls": GatedMLPFixed}, timeout=TIMEOUT),
                 module=_compare(GatedMLP, GatedMLPFixed),
                 summary="DTensor runs an op only with a sharding rule; register_sharding "
                         "gives the custom op one (element-wise: any shard in, the same out)"),
        Scenario("checkpoint_resharded", "A checkpoint saved by 2 ranks, loaded by 4 and by 1",
                 broken=Variant(reshard, Expect("error", "RuntimeError", SIZE_MISMATCH,
                                                ranks=(0, 1)), world_size=4, timeout=TIMEOUT),
                 fixed=Variant(reshard, Expect("ok", metric="max_diff", below=1e-6,
                                               metric_rank=None),
                               kwargs={"save": save_dcp, "load": load_dcp}, world_size=4,
                               timeout=TIMEOUT),
                 summary="per-rank torch.save files hold 2-rank shards: 4 ranks find the "
                         "wrong shapes or no file; torch.distributed.checkpoint reshards"),
        Scenario("non_tensor_state", "A block's step counter, generator and non-persistent "
                 "buffer across a resharded resume",
                 broken=Variant(resume, Expect("ok", metric="resume_error", above=0.1),
                                timeout=TIMEOUT),
                 fixed=Variant(resume, Expect("ok", metric="resume_error", below=1e-5),
                               kwargs={"state": weights_and_state}, timeout=TIMEOUT),
                 summary="a module's state_dict holds parameters and persistent buffers only; "
                         "a Stateful object in the checkpoint carries the rest"),
        Scenario("simulated_world", "A 2-D plan (FSDP2 x tensor parallel) checked at 64 ranks "
                 "in one process",
                 broken=Variant(simulate, Expect("error", "RuntimeError", NOT_ONE_MESH),
                                world_size=1, init_process_group=False, timeout=TIMEOUT),
                 fixed=Variant(simulate, Expect("ok", metric="param_share", below=0.02),
                               kwargs={"meshes": sliced_meshes}, world_size=1,
                               init_process_group=False, timeout=TIMEOUT),
                 summary="FSDP2 must join its mesh with the tensor-parallel one: slice both "
                         "from one init_device_mesh((dp, tp)); the fake group checks it at 64"),
        Scenario("memory_per_rank", "Bytes per rank when the plan leaves layers whole",
                 broken=Variant(memory_per_rank, Expect("ok", metric="share", above=0.5),
                                world_size=4, timeout=TIMEOUT),
                 fixed=Variant(memory_per_rank, Expect("ok", metric="share", below=0.3),
                               kwargs={"model_cls": TinyLMFixed}, world_size=4, timeout=TIMEOUT),
                 module=ModuleCase(tiny_lm, tiny_lm_fixed, tokens, strategy="tp"),
                 summary="what the plan does not name (embedding, output projection) stays "
                         "whole on every rank: a floor no world size lowers"),
    ],
)
