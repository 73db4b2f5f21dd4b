"""Lesson 09: saving and loading checkpoints under DDP -- who writes, the `module.` prefix,
map_location, and loading before or after wrapping.

Every scenario trains the same small model for a few DDP steps, writes a checkpoint into a
temporary directory that rank 0 creates and the last rank out removes (`shared_tmpdir`), and
loads it back. What changes is the piece a learner writes: a `save(model, path)`, a
`load(path)`, or a `resume(path, dev)`. The rank functions live in one module per scenario
(`runs_writers`, `runs_prefix`, `runs_map_location`, `runs_load_order`; what they share in
`runs`, the model in `modules`); this module declares the lesson.
"""
from __future__ import annotations

import torch

from ...course.registry import Expect, Lesson, Scenario, Variant
from ...launching.cuda_init import gpu_count
from .modules import Net
from .runs import checksum, count_saves, fingerprint, shared_tmpdir, train
from .figures import figures
from .runs_load_order import (resume_and_train, resume_every_rank_after_wrap,
                         resume_every_rank_before_wrap, resume_rank0_after_wrap,
                         resume_rank0_before_wrap)
from .runs_map_location import (load_gpu_checkpoint, load_to_own_device, load_without_map_location,
                           recorded_locations, save_as_gpu_rank0)
from .runs_prefix import (load_stripping_prefix, reload_into_plain_model, save_ddp_state_dict,
                     save_module_state_dict)
from .runs_writers import all_load_rank0, checkpoint_and_reload, save_on_every_rank, save_on_rank0

__all__ = ["LESSON", "Net", "checksum", "count_saves", "fingerprint", "shared_tmpdir", "train",
           "figures", "checkpoint_and_reload", "save_on_every_rank", "save_on_rank0",
           "reload_into_plain_model", "save_ddp_state_dict", "save_module_state_dict",
           "load_stripping_prefix", "load_gpu_checkpoint", "save_as_gpu_rank0",
           "load_without_map_location", "load_to_own_device", "recorded_locations", "resume_and_train",
           "resume_rank0_after_wrap", "resume_rank0_before_wrap", "resume_every_rank_after_wrap",
           "resume_every_rank_before_wrap"]


def _every_rank_wrote(result) -> list[str]:
    v = result.ranks[0].value
    problems = []
    if v["writers"] != list(range(result.world_size)):
        problems.append(f"writers {v['writers']}, expected every rank")
    if v["distinct_states_written"] != result.world_size:
        problems.append(f"{v['distinct_states_written']} distinct states written, "
                        "expected one per rank")
    return problems


def _map_location_broken() -> Expect:
    if gpu_count():  # the load succeeds, onto cuda:0 on every rank (counted without CUDA init)
        return Expect("ok", metric="off_device", above=0.5, metric_rank=None)
    return Expect("error", "RuntimeError", r"Attempting to deserialize object on a CUDA device",
                  ranks=(0, 1))


PREFIX_ERROR = (r'(?s)Missing key\(s\) in state_dict: "fc1\.weight".*'
                r'Unexpected key\(s\) in state_dict: "module\.fc1\.weight"')

LESSON = Lesson(
    id="09",
    error_class="saving and loading",
    title="Saving and loading checkpoints",
    notebook="09_saving_and_loading",
    figures=figures,
    scenarios=[
        Scenario("every_rank_writes", "Every rank writes the same checkpoint file",
                 broken=Variant(checkpoint_and_reload, Expect("ok", metric="overwritten", above=0.5,
                                                              extra=_every_rank_wrote)),
                 fixed=Variant(checkpoint_and_reload, Expect("ok", metric="overwritten", below=0.5,
                                                             extra=all_load_rank0),
                               kwargs={"save": save_on_rank0}),
                 summary="every rank writes one file: the last writer wins a race and the other "
                         "states are lost; rank 0 writes, the rest wait at a barrier, all load"),
        Scenario("module_prefix", "A DDP state_dict loaded into a plain module",
                 broken=Variant(reload_into_plain_model, Expect("error", "RuntimeError", PREFIX_ERROR,
                                                                ranks=(0, 1))),
                 fixed=Variant(reload_into_plain_model, Expect("ok", metric="mismatch", below=0.5,
                                                               metric_rank=None),
                               kwargs={"save": save_module_state_dict}),
                 summary="ddp_model.state_dict() prefixes every key with `module.`; save "
                         "ddp_model.module.state_dict() (or strip the prefix when loading)"),
        Scenario("map_location", "A GPU rank 0's checkpoint loaded without map_location",
                 broken=Variant(load_gpu_checkpoint, _map_location_broken()),
                 fixed=Variant(load_gpu_checkpoint, Expect("ok", metric="off_device", below=0.5,
                                                           metric_rank=None),
                               kwargs={"load": load_to_own_device}),
                 summary="torch.load restores tensors on the device the file records (cuda:0); "
                         "map_location=device() puts them on each rank's own device"),
        Scenario("load_order", "Rank 0 loads the checkpoint after DDP wrapping",
                 broken=Variant(resume_and_train, Expect("ok", metric="drift", above=1e-3,
                                                         metric_rank=None)),
                 fixed=Variant(resume_and_train, Expect("ok", metric="drift", below=1e-6,
                                                        metric_rank=None),
                               kwargs={"resume": resume_rank0_before_wrap}),
                 summary="DDP broadcasts rank 0's weights once, when it wraps: load before "
                         "wrapping (or on every rank), or the other ranks keep their own"),
    ],
)
