"""Lesson 16 beyond the registry's declarations: what each rank was handed under the plan, the
checkpoint's files and exact values, the fake world's shapes and bytes against the real ranks',
and the private PyTorch APIs the lesson stands on. Runs are shared through conftest's `runs`."""
from __future__ import annotations

import glob
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from ddp_lab.lessons import l16_tensor_parallel_and_checkpoints as l16
from ddp_lab.lessons.l16_tensor_parallel_and_checkpoints import modules as m

LESSON = l16.LESSON
PARAMS = sum(p.numel() for p in m.TinyLM().parameters())
# Row-wise layers keep their bias whole (Replicate) on every tensor-parallel rank.
WHOLE_BIASES = 2 * m.BLOCKS * m.WIDTH
UNPLANNED = m.VOCAB * m.WIDTH + (m.WIDTH * m.VOCAB + m.VOCAB)  # embedding, output projection


@pytest.fixture(autouse=True, scope="module")
def warm():
    LESSON.prepare()


def test_private_torch_apis_the_lesson_stands_on():
    """If this fails after a torch upgrade, the lesson's simulated world (section 6) or its
    sharding rule (section 3) must be rewritten against the new API."""
    try:
        l16.fake_store()
    except ImportError as exc:
        pytest.fail(str(exc))
    assert "fake" in dist.Backend.backend_list, (
        f"importing {l16.FAKE_API} no longer registers the 'fake' backend (lesson 16 was "
        f"written for torch {l16.WRITTEN_FOR}, this is torch {torch.__version__})")
    try:
        from torch.distributed.tensor.experimental import register_sharding  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"torch.distributed.tensor.experimental.register_sharding (experimental; "
                    f"lesson 16 was written for torch {l16.WRITTEN_FOR}) is gone from torch "
                    f"{torch.__version__}: {exc}")


def test_a_rank_holds_half_of_qs_features_and_splits_them_into_all_heads(runs):
    broken, fixed = runs("heads_per_rank", "broken"), runs("heads_per_rank", "fixed")
    for run in (broken, fixed):
        seen = run.values[0]["seen"]
        assert seen["q"] == {"got": "Tensor (2, 6, 64)", "gave": "Tensor (2, 6, 32)"}
    assert torch.empty(2, 6, 32).view(2, 6, m.HEADS, -1).shape[-1] == m.WIDTH // m.HEADS // 2
    assert broken.values[0]["output_error"] > 0.05
    assert broken.values[0] == broken.values[1]  # every rank computes the same wrong output


def test_a_colwise_rowwise_pair_all_reduces_once_forward_and_once_backward(runs):
    """The forward and the backward of the split block are the two steps `compare` marks; the
    flight recorder's collectives of each. The backward's all-reduces are the input's gradient,
    Partial on every rank, made whole by from_local's backward (torch/distributed/tensor/
    _api.py:239-283 in 2.13): one per colwise layer that reads the input."""
    def passes(name, which):
        run = runs(name, which)
        counted = {tuple(r.collectives_per_step()) for r in run.ranks}
        ops = {c.op for r in run.ranks for step in r.step_collectives() for c in step}
        assert ops == {"all_reduce"}, (name, which, ops)
        assert len(counted) == 1, (name, which, counted)  # every rank the same
        return counted.pop()
    assert passes("local_reduction", "broken") == (1, 1)  # up then down: the plain pair
    assert passes("local_reduction", "fixed") == (2, 2)  # the DTensor mean: one more each way
    assert passes("heads_per_rank", "fixed") == (1, 3)  # q, k, v each read the input
    assert passes("op_without_sharding", "fixed") == (1, 2)  # gate and up read it


def _no_rule_for(ops=("unfold", "renorm")) -> dict:
    """On a rank: each op on a DTensor (sharded, and whole), and what DTensor said."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    calls = {"unfold": lambda t: t.unfold(1, 2, 2), "renorm": lambda t: t.renorm(2, 0, 1.0)}
    out = {}
    for placement in (Shard(0), Replicate()):
        x = distribute_tensor(torch.ones(4, 4), mesh, [placement])
        for op in ops:
            try:
                calls[op](x)
                out[f"{op} {placement}"] = "ran"
            except NotImplementedError as exc:
                out[f"{op} {placement}"] = str(exc)
    return out


def test_no_sharding_rule_for_unfold_or_renorm_on_torch_2_13():
    """Lesson 16 says, as a fact of torch 2.13, that DTensor has no rule for Tensor.unfold nor
    renorm (nothing in torch/distributed/tensor/_ops/ registers aten.unfold or aten.renorm).
    When this fails, a torch release added one: reword section 3 and "Going further"."""
    import ddp_lab

    result = ddp_lab.launch(_no_rule_for, timeout=l16.TIMEOUT).raise_for_status()
    for key, said in result.values[0].items():
        op = key.split()[0]
        assert said == f"Operator aten.{op}.default does not have a sharding strategy registered.", (
            f"{key} on torch {torch.__version__}: {said}")


def test_the_norm_sees_half_the_features_unless_dtensor_reduces(runs):
    broken = runs("local_reduction", "broken").values[0]["seen"]
    fixed = runs("local_reduction", "fixed").values[0]["seen"]
    assert broken["down"]["got"] == "Tensor (2, 6, 128)"  # 128 of the 256 hidden features
    assert fixed["up"]["gave"] == "DTensor Shard(dim=2) of (2, 6, 256), local (2, 6, 128)"
    assert fixed["up"]["mean(-1) of it"] == "Partial(avg)"  # a mean still to be all-reduced


def test_the_custom_op_is_named_in_pytorchs_message_and_in_the_block(runs):
    broken = runs("op_without_sharding", "broken")
    for r in broken.ranks:
        assert r.error.message == ("Operator ddp_lab.swiglu.default does not have a sharding "
                                   "strategy registered.")
        assert "swiglu(self.gate(x), self.up(x))" in r.error.traceback
    assert runs("op_without_sharding", "fixed").values[0]["grad_error"] < l16.TOLERANCE


def test_per_rank_files_do_not_reshard(runs):
    broken = runs("checkpoint_resharded", "broken")
    assert [r.error.type for r in broken.ranks] == ["RuntimeError", "RuntimeError",
                                                    "FileNotFoundError", "FileNotFoundError"]
    assert broken.ranks[2].error.message.endswith("'rank2.pt'")  # relative: no machine path
    assert "size mismatch for blocks.0.attn.o.weight" in broken.ranks[0].error.message


def test_dcp_loads_the_saved_values_exactly_at_4_ranks_and_at_1(runs):
    fixed = runs("checkpoint_resharded", "fixed").values
    assert [v["max_diff_at_4"] for v in fixed] == [0.0] * 4
    assert fixed[0]["max_diff_at_1"] == 0.0
    assert fixed[0]["files"] == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"]
    assert fixed[0]["local_rows_at_4"] == (m.VOCAB // 4, m.WIDTH)


def test_the_checkpoint_directory_is_removed(runs):
    runs("checkpoint_resharded", "fixed")
    runs("non_tensor_state", "fixed")
    assert glob.glob(os.path.join(tempfile.gettempdir(), "ddp-lab-l16-*")) == []


def test_weights_alone_restart_the_blocks_counter_and_state_restores_it(runs):
    broken = runs("non_tensor_state", "broken").values[0]
    fixed = runs("non_tensor_state", "fixed").values[0]
    assert broken["steps"] == (4, 1) and fixed["steps"] == (4, 4)
    assert broken["center_moved"] > 0.01 > 1e-6 > fixed["center_moved"]
    assert list(m.Noisy().state_dict()) == ["up.weight", "up.bias", "down.weight", "down.bias"]


def test_the_fake_world_refuses_separate_meshes(runs):
    broken = runs("simulated_world", "broken")
    assert "fully_shard" in broken.ranks[0].error.traceback


def test_the_fake_world_gives_each_rank_one_64th(runs):
    v = runs("simulated_world", "fixed").values[0]
    assert (v["backend"], v["world_size"], v["mesh"]) == ("fake", 64, (16, 4))
    glob_, local, placements = v["shapes"]["emb.weight"]
    assert (glob_, local) == ((m.VOCAB, m.WIDTH), (m.VOCAB // 64, m.WIDTH))
    assert "Shard(dim=0)" in placements
    # split 64 ways, but the row-wise biases only 16 ways (FSDP2): whole across the 4 tp ranks
    want = 4 * ((PARAMS - WHOLE_BIASES) // 64 + WHOLE_BIASES // 16)
    assert v["bytes"]["params"] == v["bytes"]["grads"] == want
    assert v["bytes"]["optim"] == 2 * want + 4 * len(v["shapes"])  # 2 moments, a step each


def test_the_simulation_holds_the_bytes_the_real_ranks_held(runs):
    curves = runs("simulated_world", "fixed").values[0]["curves"]
    for name, which in (("TinyLM", "broken"), ("TinyLMFixed", "fixed")):
        real = runs("memory_per_rank", which).values[0]["bytes"]
        assert {n: curves[name][n] for n in (2, 4)} == {n: real[n]["params"] for n in (2, 4)}


def test_what_the_plan_leaves_out_is_a_floor(runs):
    broken = runs("memory_per_rank", "broken").values
    fixed = runs("memory_per_rank", "fixed").values
    for n in (2, 4):
        floor = UNPLANNED + WHOLE_BIASES
        assert broken[0]["bytes"][n]["params"] == 4 * (floor + (PARAMS - floor) // n)
        assert fixed[0]["bytes"][n]["params"] == 4 * (WHOLE_BIASES + (PARAMS - WHOLE_BIASES) // n)
    assert [v["share"] for v in broken] == [broken[0]["share"]] * 4


def test_a_vocabulary_split_embeddings_gradient_is_whole_on_torch_2_13(runs):
    """DTensor's embedding backward has no rule that splits the weight's gradient by rows
    (torch/distributed/tensor/_ops/_embedding_ops.py:66-97 in 2.13): each rank holds the
    whole gradient of the embedding. When this fails, a torch release added that rule."""
    fixed = runs("memory_per_rank", "fixed").values[0]["bytes"]
    for n in (2, 4):
        assert fixed[n]["grads"] - fixed[n]["params"] == 4 * (m.VOCAB - m.VOCAB // n) * m.WIDTH


def test_memory_figure(runs):
    results = {"simulated_world": {"fixed": runs("simulated_world", "fixed")},
               "memory_per_rank": {w: runs("memory_per_rank", w) for w in ("broken", "fixed")}}
    ax = LESSON.figures(results)["memory_per_rank"].axes[0]
    assert "KiB" in ax.get_ylabel() and "ranks" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(n) for n in l16.SIZES]
