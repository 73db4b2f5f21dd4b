"""Lesson 00 beyond its declarations: each step of the source document's example."""
import pytest
import torch

from ddp_lab.launching.cuda_init import gpu_count
from ddp_lab.lessons import l00_launching_ranks as l00
from conftest import scenario_run  # one run a session, a notebook's where it made it


# Steps 1 and 3 declare both builds' errors; each build must still raise its own.
CUDA_BUILD = torch.cuda._is_compiled()
THIS_BUILDS = {1: "ValueError: ProcessGroupNCCL is only supported with GPUs" if CUDA_BUILD
               else "RuntimeError: Distributed package doesn't have NCCL built in",
               3: "RuntimeError: Found no NVIDIA driver on your system" if CUDA_BUILD
               else "RuntimeError: Cannot access accelerator device when none is available"}


@pytest.mark.parametrize("fixes", range(len(l00.SOURCE_STEPS)))
def test_each_step_of_the_source_example_fails_or_passes_as_declared(fixes):
    result = l00._source_variant(fixes).run()
    l00.SOURCE_STEPS[fixes].assert_met(result)
    if fixes in THIS_BUILDS and not gpu_count():
        assert str(result.root_cause.error).startswith(THIS_BUILDS[fixes])


def test_every_fix_applies_and_has_a_diff():
    assert len(l00.SOURCE_STEPS) == len(l00.SOURCE_FIXES) + 1
    for k in range(1, len(l00.SOURCE_FIXES) + 1):
        assert l00.source_fix_diff(k).startswith("--- step")


def test_the_corrected_example_trains_on_every_rank():
    result = l00._source_variant(len(l00.SOURCE_FIXES)).run()
    losses = [v["losses"] for v in result.values]
    assert all(len(l) == 20 and l[-1] < 0.8 * l[0] for l in losses)


def test_figure_has_labelled_axes():
    result = scenario_run(l00.LESSON.scenario("source_example"), "fixed")
    fig = l00.figures({"source_example": {"fixed": result}})["source_example_losses"]
    ax = fig.axes[0]
    assert ax.get_xlabel() and ax.get_ylabel() and len(ax.lines) == 2


def test_the_corrected_example_reads_local_rank_and_sets_the_device():
    code = l00.source_example(len(l00.SOURCE_FIXES))
    assert 'os.environ.get("LOCAL_RANK"' in code and "torch.cuda.set_device(device)" in code
    assert "device_id=device" in code and "cuda', rank" not in code and "device_ids=[rank]" not in code


def test_each_chinese_comment_keeps_an_english_translation_beside_it():
    lines = [l for l in l00.SOURCE_EXAMPLE.splitlines() if any("\u4e00" <= ch <= "\u9fff" for ch in l)]
    assert len(lines) == 2 and all(l.rstrip().endswith(")") and "(" in l for l in lines)
