"""The doctor's dynamic checks on real ranks: unused parameters, parameters born in forward,
collectives in forward, hangs, exceptions on one rank, and its speed on a 10-layer module."""
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    """Start the launcher's fork server once, so the short timeouts below time the module only."""
    ddp_lab.launch(_noop, timeout=120)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class AuxHead(MLP):
    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(4, 4)  # never used in forward


class RankBranch(MLP):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.net(x)
        return self.a(h) if dist.get_rank() == 0 else self.b(h)


class GateInForward(MLP):
    def forward(self, x):
        self.gate = nn.Parameter(torch.ones(4))  # a new parameter every step
        return self.net(x) * self.gate


class AllReduceInForward(MLP):
    def forward(self, x):
        y = self.net(x)
        dist.all_reduce(y.detach().clone())  # e.g. to log a global statistic
        return y


class TrainOnlyAllReduce(MLP):
    def forward(self, x):
        y = self.net(x)
        if self.training:
            dist.all_reduce(y.detach().clone())
        return y


class Rank0AllReduce(MLP):
    def forward(self, x):
        y = self.net(x)
        if dist.get_rank() == 0:
            dist.all_reduce(y.detach().clone())
        return y


class Rank1Raises(MLP):
    def forward(self, x):
        if dist.get_rank() == 1:
            raise ValueError("rank 1 cannot read its shard")
        return self.net(x)


class ZerosInForward(MLP):
    def forward(self, x):
        return self.net(x) + torch.zeros(x.shape[0], 4)


class TenLayers(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(10))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def x16(rank=0):
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))


def only(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, f"no single {code!r} finding in:\n{report}"
    return found[0]


def test_unused_parameters_are_named_with_pytorchs_own_message():
    report = doctor(AuxHead, x16())
    f = only(report, "unused-parameters")
    assert (f.severity, f.lesson) == ("error", "01")
    assert f.evidence[0] == "no gradient on any rank: aux.bias, aux.weight"
    assert any("Expected to have finished reduction in the prior iteration" in e for e in f.evidence)
    assert "PyTorch: Parameters which did not receive grad for rank 0: aux.bias, aux.weight" in f.evidence
    assert report.status == "ok" and report.exit_status == 1  # the checks went on with find_unused


def test_rank_dependent_unused_parameters():
    f = only(doctor(RankBranch, x16()), "rank-dependent-unused-parameters")
    assert f.evidence[:2] == ["rank 0: b.bias, b.weight", "rank 1: a.bias, a.weight"]


def test_parameter_created_in_forward():
    report = doctor(GateInForward, x16())
    f = only(report, "parameter-created-in-forward")
    assert (f.severity, f.lesson) == ("error", "01")
    assert "created in forward: Parameter created at GateInForward.forward" in f.evidence[0]
    assert "registered (or replaced) during forward: gate" in f.evidence
    # DDP wraps a fresh instance, as a training script does: it never sees `gate` (born at each
    # forward, after DDP was built), so nothing fails -- the parameter is silently not trained.
    assert report.status == "ok" and "unused-parameters" not in report.codes()


def test_collective_in_forward_is_recorded_per_rank():
    f = only(doctor(AllReduceInForward, x16()), "collective-in-forward")
    assert (f.severity, f.lesson) == ("warning", "03")
    assert f.evidence[0].startswith("rank 0: 1 call(s): all_reduce() from AllReduceInForward.forward")
    assert f.evidence[1].startswith("rank 1: 1 call(s): all_reduce()")
    note = only(doctor(TrainOnlyAllReduce, x16()), "collective-in-training-forward")
    assert note.severity == "info"  # eval mode calls none: one rank may evaluate alone


def test_rank_dependent_collective_hangs_and_is_reported_with_stacks():
    start = time.time()
    report = doctor(Rank0AllReduce, x16(), timeout=6)
    assert time.time() - start < 30
    f = only(report, "hang")
    assert (f.severity, f.lesson, report.status) == ("error", "03", "timeout")
    assert f.evidence[0].startswith("rank 0 stuck in the first forward/backward (no DDP yet): "
                                    "all_reduce(), called from forward()")
    assert f.evidence[1].startswith("rank 1 stuck comparing the first forward/backward")
    assert "its forward called 0 collective(s)" in f.evidence[1]
    assert "--- stack of rank 0 ---" in f.trace and "in all_reduce" in f.trace


def test_exception_on_one_rank_is_the_root_cause():
    report = doctor(Rank1Raises, x16())
    f = only(report, "exception")
    assert f.lesson == "06" and f.title == "rank 1 raised ValueError"
    assert f.evidence[0] == ("rank 1 raised ValueError in the first forward/backward (no DDP yet): "
                             "rank 1 cannot read its shard")
    assert f.evidence[1].startswith("then rank 0: ")  # stopped, or told its peer went away
    assert "raise ValueError" in f.trace


def test_tensor_created_without_device():
    f = only(doctor(ZerosInForward, x16()), "tensor-created-without-device")
    assert (f.severity, f.lesson) == ("warning", "02")
    assert f.evidence[0].startswith("torch.zeros(...) at ZerosInForward.forward")
    assert f.evidence[0].endswith("torch.zeros(x.shape[0], 4)")  # the line, from the source file


def test_instance_and_rank_callable_input():
    model = MLP()
    report = doctor(model, x16, steps=2, world_size=2)
    assert report.findings == [] and report.status == "ok" and report.target == "MLP instance"
    assert model.net[0].weight.grad is None  # the caller's instance is left untouched


def test_ten_layer_module_takes_seconds_not_minutes():
    start = time.time()
    report = doctor(TenLayers, torch.randn(32, 64))
    seconds = time.time() - start
    assert report.findings == [] and report.status == "ok"
    assert seconds < 30, f"the doctor took {seconds:.1f} s on a 10-layer module"
