"""The doctor on gradient and precision problems, on real ranks: reentrant checkpointing under
DDP, in-place edits of saved tensors, graphs kept across steps, custom autograd Functions under
autocast, overflow in fp16."""
import pytest
import torch
import torch.utils.checkpoint as cp
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


class CheckpointTwice(nn.Module):
    """The same block checkpointed twice with the reentrant implementation."""

    reentrant = True

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x):
        h = self.inp(x)
        h = cp.checkpoint(self.block, h, use_reentrant=self.reentrant)
        return cp.checkpoint(self.block, h, use_reentrant=self.reentrant)


class CheckpointTwiceFixed(CheckpointTwice):
    reentrant = False


class InplaceSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = torch.sigmoid(self.a(x))
        h.mul_(2)  # sigmoid saved h for its backward
        return self.b(h)


class KeepsGraph(nn.Module):
    """Keeps last step's output (with its graph) and adds it to the next one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)
        self.prev = None

    def forward(self, x):
        y = self.lin(x)
        if self.prev is not None:
            y = y + self.prev
        self.prev = y
        return y


class MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.t() @ x


class MatMulAmp(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w, grad.t() @ x


class CustomLayer(nn.Module):
    fn = MatMul

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.w = nn.Parameter(torch.randn(4, 16) / 4)

    def forward(self, x):
        return self.fn.apply(self.inp(x), self.w)


class CustomLayerAmp(CustomLayer):
    fn = MatMulAmp


class Loud(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x * 1e6)  # beyond fp16's 65504 after the matmul


def x16(rank=0):
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))


def codes(report, severities=("error", "warning")):
    return {(f.code, f.lesson) for f in report.findings if f.severity in severities}


def test_reentrant_checkpoint_twice_under_ddp():
    report = doctor(CheckpointTwice, x16())
    assert codes(report) == {("checkpoint-under-ddp", "05"), ("reentrant-checkpoint", "05")}
    (err,) = report.errors
    assert "Expected to mark a variable ready only once" in err.evidence[0]
    assert "in the DDP training steps (step 1)" in err.evidence[0]  # the bare module was fine
    (warn,) = report.warnings
    assert warn.evidence[0].startswith("checkpointed at CheckpointTwice.forward")
    assert doctor(CheckpointTwiceFixed, x16()).findings == []


def test_inplace_edit_of_a_saved_tensor():
    (err,) = doctor(InplaceSigmoid, x16()).errors
    assert (err.code, err.lesson) == ("inplace-modification", "05")
    assert "modified by an inplace operation" in err.evidence[0]


def test_graph_kept_across_steps():
    report = doctor(KeepsGraph, x16())
    err = [f for f in report.errors if f.lesson == "05"]
    assert [f.code for f in err] == ["backward-twice"]
    assert "Trying to backward through the graph a second time" in err[0].evidence[0]


def test_custom_function_without_custom_fwd_fails_under_bf16_autocast():
    report = doctor(CustomLayer, x16(), amp="bf16")
    (err,) = report.errors
    assert (err.code, err.lesson) == ("dtype-mismatch", "04")
    assert "in the first forward/backward" in err.evidence[0] and "BFloat16" in err.evidence[0]
    assert "in backward" in err.trace
    (warn,) = report.warnings
    assert (warn.code, warn.lesson) == ("custom-function-without-custom-fwd", "04")
    assert warn.evidence[0].startswith("MatMul: under autocast")


def test_custom_function_notes_without_amp_and_passes_when_decorated():
    plain = doctor(CustomLayer, x16())
    assert codes(plain) == set() and codes(plain, ("info",)) == {
        ("custom-function-without-custom-fwd", "04")}
    assert doctor(CustomLayerAmp, x16(), amp="bf16").findings == []


def test_fp16_overflow_is_non_finite():
    report = doctor(Loud, x16(), amp="fp16")
    assert ("non-finite-values", "04") in codes(report)
    assert doctor(Loud, x16()).findings == []  # float32 holds it


@pytest.mark.parametrize("reentrant", [False, True])
def test_every_checkpoint_is_watched_once_on_this_torch(reentrant):
    """The doctor's watch sees each checkpointed region once, with its options, on whatever
    generator this torch runs (torch 2.14 moved the non-reentrant one to `..._impl`)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from ddp_lab.doctor.exam.regions import watch_checkpoints

    calls = []
    x = torch.randn(4, 3, requires_grad=True)
    with watch_checkpoints(calls, lambda: "here"):
        out = checkpoint(lambda t: torch.nn.functional.dropout(t, 0.5), x,
                         use_reentrant=reentrant, preserve_rng_state=False)
    out.sum().backward()
    assert calls == [{"reentrant": reentrant, "preserve_rng": False, "rng_used": True,
                      "where": "here"}]
