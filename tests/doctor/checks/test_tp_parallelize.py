"""The check tp_parallelize (doctor/checks/tp_parallelize.py, records from
doctor/exam/tensor_parallel.py's probe on 2 real ranks): the user's own parallelize function, a tie
broken by the split and made again, a fused QKV split contiguously, a bias left whole, no plan
at all, and the lesson-16 modules an op without a sharding rule and a plan leaving bytes whole."""
import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from ddp_lab.doctor import checks
from ddp_lab.doctor.checks.api import Subject
from ddp_lab.doctor.exam import tensor_parallel
from ddp_lab.doctor.exam.inputs import resolve_model
from ddp_lab.doctor.userline import code_map, code_of
from ddp_lab.lessons.l16_tensor_parallel_and_checkpoints import modules as m

LOUD = ("error", "warning")


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(32, 16), nn.Linear(16, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


TIED_PLAN = {"embed": RowwiseParallel(input_layouts=Replicate()),
             "head": ColwiseParallel(output_layouts=Replicate())}


def split_untied(model, mesh):
    parallelize_module(model, mesh, TIED_PLAN)


def split_retied(model, mesh):
    parallelize_module(model, mesh, TIED_PLAN)
    model.head.weight = model.embed.weight


class FusedQKV(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(8, 24), nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)


class LooseBias(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.out = nn.Linear(8, 16, bias=False), nn.Linear(16, 8)
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return self.out(self.proj(x) + self.bias)


def split_proj(model, mesh):
    parallelize_module(model, mesh, {"proj": ColwiseParallel(), "out": RowwiseParallel()})


def check(model, example, plan=None, parallelize=None):
    source = resolve_model(model)
    where = code_map(source.build())
    if parallelize is not None:
        where.update(code_of(parallelize))
    return tensor_parallel.phase(Subject(source, example, 2, timeout=60, strategy="tp",
                                         tp_plan=plan, parallelize=parallelize, where=where))[1]


def loud(found):
    return [f for f in found if f.severity in LOUD]


def test_a_tie_the_split_breaks_is_named_at_the_users_line():
    found = check(TiedLM, torch.randint(0, 32, (2, 5)), parallelize=split_untied)
    [f] = loud(found)
    assert (f.code, f.severity) == ("tp-tie-broken", "error")
    assert f.evidence[0].startswith("head.weight and embed.weight were one parameter before "
                                    "parallelising and are two after")
    assert any(e.startswith("output at step 2 differs by ") for e in f.evidence)
    assert f.where.startswith("test_tp_parallelize.py:") and "parallelize_module(" in f.where


def test_the_tie_made_again_after_the_split_passes():
    found = check(TiedLM, torch.randint(0, 32, (2, 5)), parallelize=split_retied)
    assert not loud(found), [f.code for f in loud(found)]
    assert [f.code for f in found] == ["tp-plan"]


def test_without_a_plan_nothing_is_guessed():
    [f] = check(FusedQKV, torch.randn(2, 4, 8))
    assert (f.code, f.severity) == ("tp-needs-plan", "info")


def test_a_fused_qkv_split_contiguously_computes_something_else():
    found = check(FusedQKV, torch.randn(2, 4, 8), plan={"qkv": "colwise", "out": "rowwise"})
    [f] = loud(found)
    assert f.code == "tp-output-differs" and f.evidence[0].startswith("output at step 1 differs")


def test_a_bias_left_whole_fails_at_the_forward_line():
    [f] = loud(check(LooseBias, torch.randn(4, 8), parallelize=split_proj))
    assert f.code == "tp-run-failed" and "PyTorch said: RuntimeError" in f.evidence[0]
    assert f.where.startswith("test_tp_parallelize.py:") and "self.proj(x) + self.bias" in f.where


def test_the_lesson_modules_op_without_rule_and_bytes_left_whole():
    [f] = loud(check(m.GatedMLP, m.features(0)))
    assert f.code == "op-without-sharding-strategy"
    [f] = loud(check(m.tiny_lm, m.tokens(0)))
    assert f.code == "plan-leaves-weights-whole" and f.severity == "warning"


def test_the_check_is_registered_for_the_doctor_under_tp():
    c = checks.registry()["tp_parallelize"]
    assert c.tools == ("doctor",) and c.strategies == ("tp",)
