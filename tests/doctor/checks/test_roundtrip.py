"""The check roundtrip (doctor/checks/roundtrip.py, saving and loading in doctor/exam/save_load.py):
torch.save under DDP in this process, torch.distributed.checkpoint on 2 real ranks under tensor
parallelism (a plain per-rank tensor deduplicated) and FSDP2 (a state-dict hook's copies, which
the in-place dcp.load fills instead of the parameters); each broken module caught with the
user's line, each fixed one clean."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from ddp_lab.doctor import checks
from ddp_lab.doctor.checks.api import Subject
from ddp_lab.doctor.exam import save_load, sharded, tensor_parallel
from ddp_lab.doctor.exam.inputs import resolve_model
from ddp_lab.doctor.userline import code_map, code_of


def torch_save_findings(source, example):
    return save_load.phase(Subject(source, example))[1]


class Counted(nn.Module):
    def __init__(self, persistent=False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(()), persistent=persistent)

    def forward(self, x):
        if self.training:
            self.seen += 1
        return self.fc(x) * self.seen


class Saved(Counted):
    def __init__(self):
        super().__init__(persistent=True)


class Reduces(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        dist.all_reduce(y)
        return y


def test_torch_save_loses_a_non_persistent_buffer_and_names_its_line():
    [f] = torch_save_findings(resolve_model(Counted), torch.randn(2, 4))
    assert (f.code, f.severity, f.lesson) == ("checkpoint-round-trip-lost", "error", "09")
    assert f.evidence[0].startswith("seen: differs by 1.0e+00 after the round trip")
    assert f.where.startswith("test_roundtrip.py:") and 'register_buffer("seen"' in f.where
    assert torch_save_findings(resolve_model(Saved), torch.randn(2, 4)) == []


def test_a_module_that_needs_its_ranks_is_not_round_tripped_here():
    [f] = torch_save_findings(resolve_model(Reduces), torch.randn(2, 4))
    assert (f.code, f.severity) == ("checkpoint-round-trip-not-run", "info")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(8, 16, bias=False), nn.Linear(16, 8)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return self.out(self.proj(x) + self.bias)


def plain_slices(model, mesh):
    parallelize_module(model, mesh, {"proj": ColwiseParallel(), "out": RowwiseParallel()})
    model.bias = nn.Parameter(model.bias.data.chunk(mesh.size())[mesh.get_local_rank()].clone())


def dtensor_slices(model, mesh):
    plan = {"proj": ColwiseParallel(use_local_output=False), "out": RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    piece = model.bias.data.chunk(mesh.size())[mesh.get_local_rank()].clone()
    model.bias = nn.Parameter(DTensor.from_local(piece, mesh, [Shard(0)]))


def tp(parallelize):
    source = resolve_model(Block)
    where = {**code_map(source.build()), **code_of(parallelize)}
    found = tensor_parallel.phase(Subject(source, torch.randn(4, 8), 2, timeout=60, strategy="tp",
                                          parallelize=parallelize, where=where))[1]
    return [f for f in found if f.severity != "info"]


def test_dcp_keeps_one_ranks_plain_slice_and_the_line_is_named():
    [f] = tp(plain_slices)
    assert (f.code, f.severity, f.lesson) == ("checkpoint-round-trip-lost", "error", "16")
    assert f.evidence[0].startswith("bias: differs by ") and f.evidence[0].endswith("(rank 1)")
    assert any("_dedup_save_plans.py:42-55" in e for e in f.evidence)
    assert f.where.startswith("test_roundtrip.py:") and "chunk(mesh.size())" in f.where


def test_a_dtensor_slice_comes_back():
    assert tp(dtensor_slices) == []


def export_copy(module, state_dict, prefix, local_metadata):
    state_dict[prefix + "w"] = state_dict.pop(prefix + "w_t").t().contiguous()


def export_view(module, state_dict, prefix, local_metadata):
    state_dict[prefix + "w"] = state_dict.pop(prefix + "w_t").t()


def import_layout(state_dict, prefix, *args):
    if prefix + "w" in state_dict:
        state_dict[prefix + "w_t"] = state_dict.pop(prefix + "w").t()


class Transposed(nn.Module):
    def __init__(self, hook=export_copy):
        super().__init__()
        self.w_t = nn.Parameter(torch.randn(8, 8))
        self._register_state_dict_hook(hook)
        self._register_load_state_dict_pre_hook(import_layout)

    def forward(self, x):
        return x @ self.w_t


class HookNet(nn.Module):
    def __init__(self, hook=export_copy):
        super().__init__()
        self.a, self.b = Transposed(hook), Transposed(hook)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class ViewNet(HookNet):
    def __init__(self):
        super().__init__(export_view)


def fsdp2(model):
    source = resolve_model(model)
    found = sharded.phase(Subject(source, torch.randn(4, 8), 2, timeout=60, strategy="fsdp2",
                                  where=code_map(source.build())))[1]
    return [f for f in found if f.severity != "info"]


def test_dcp_load_in_place_fills_a_hooks_copy_and_names_the_hook():
    [f] = fsdp2(HookNet)
    assert (f.code, f.severity) == ("checkpoint-round-trip-lost", "warning")
    assert f.evidence[:2] == [e for e in f.evidence if e.endswith("after dcp.load")]
    assert {e.split(":")[0] for e in f.evidence[:2]} == {"a.w_t", "b.w_t"}
    assert f.where.startswith("test_roundtrip.py:") and ".t().contiguous()" in f.where


def test_a_hook_returning_views_comes_back():
    assert fsdp2(ViewNet) == []


def test_the_check_is_registered_for_the_doctor():
    c = checks.registry()["roundtrip"]
    assert c.tools == ("doctor",) and c.strategies is None  # every strategy's rule
