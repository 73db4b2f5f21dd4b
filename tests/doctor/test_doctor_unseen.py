"""The doctor on modules the course does not contain (issue 15, points 1-5): each test uses a
module written for it, modelled on a public bug report, and failed on the doctor before it
learned the mechanism (checked on commit 8f3add5)."""
import json
import os
import textwrap

import pytest
import torch
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor
from ddp_lab.doctor.cli import main


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


def _texts(report):
    return "\n".join([f.title + "\n" + "\n".join(f.evidence) + "\n" + f.fix
                      for f in report.findings])


# 1 -- the probe must not change the module DDP wraps ------------------------------------------

class ActNormNet(nn.Module):
    """Data-dependent initialisation (Glow's ActNorm): the first batch sets loc and scale."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.loc = nn.Parameter(torch.zeros(16))
        self.scale = nn.Parameter(torch.ones(16))
        self.register_buffer("initialized", torch.tensor(False))

    def forward(self, x):
        h = self.lin(x)
        if not bool(self.initialized):
            with torch.no_grad():
                self.loc.copy_(-h.mean(0))
                self.scale.copy_(1 / (h.std(0) + 1e-6))
                self.initialized.fill_(True)
        return (h + self.loc) * self.scale


def test_first_batch_initialiser_is_caught_after_ddp_broadcast():
    report = doctor(ActNormNet, torch.randn(8, 16))
    (f,) = [f for f in report.errors if f.code == "parameters-set-in-forward"]
    assert f.lesson == "01" and "loc" in "\n".join(f.evidence) and "scale" in "\n".join(f.evidence)
    assert any("after DDP's broadcast" in e for e in f.evidence)
    assert "parameters-differ-between-ranks" not in report.codes()  # the mechanism, once


# 2 -- the user's loss -------------------------------------------------------------------------

class WithPooler(nn.Module):
    """An encoder returning (sequence, pooled): a token loss never uses the pooler."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 16)
        self.pooler = nn.Linear(16, 16)

    def forward(self, x):
        h = torch.tanh(self.enc(x))
        return h, torch.tanh(self.pooler(h.mean(1)))


POOLER_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class WithPooler(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(16, 16)
            self.pooler = nn.Linear(16, 16)

        def forward(self, x):
            h = torch.tanh(self.enc(x))
            return h, torch.tanh(self.pooler(h.mean(1)))
''')


def test_cli_loss_finds_the_pooler_the_training_loss_ignores(tmp_path, capsys):
    path = tmp_path / "pooler.py"
    path.write_text(POOLER_FILE)
    args = [f"{path}:WithPooler", "--input", "torch.randn(4, 6, 16)", "--json"]
    assert main(args) == 0  # the default loss uses every output
    default = json.loads(capsys.readouterr().out)
    assert any("every floating-point tensor of the output" in n for n in default["notes"])
    assert main(args + ["--loss", "lambda out, batch: out[0].pow(2).mean()"]) == 1
    data = json.loads(capsys.readouterr().out)
    (f,) = [f for f in data["findings"] if f["code"] == "unused-parameters"]
    assert f["evidence"][0] == "no gradient on any rank: pooler.bias, pooler.weight"
    assert any("the loss you gave" in n for n in data["notes"])


def test_bad_loss_expression_exits_2(tmp_path, capsys):
    path = tmp_path / "pooler.py"
    path.write_text(POOLER_FILE)
    assert main([f"{path}:WithPooler", "--input", "torch.randn(4, 6, 16)", "--loss", "42"]) == 2
    assert "--loss" in capsys.readouterr().err


def test_report_says_what_the_default_loss_assumed():
    report = doctor(WithPooler, torch.randn(4, 6, 16))
    note = [n for n in report.notes if n.startswith("loss:")][0]
    assert "every floating-point tensor of the output (2 tensors)" in note
    assert "loss_fn" in note and "loss: " in report.text()


def _noisy_loss(out):
    return (out[0] * torch.randn(out[0].shape)).sum() + out[1].sum()


def test_random_numbers_in_the_users_loss_are_not_blamed_on_forward():
    report = doctor(WithPooler, torch.randn(4, 6, 16), loss_fn=_noisy_loss)
    assert "tensor-created-without-device" not in report.codes(), report.text()


def test_loss_fn_may_take_the_batch():
    report = doctor(WithPooler, torch.randn(4, 6, 16), loss_fn=lambda out, batch: out[0].mean())
    assert "unused-parameters" in report.codes()


# 3 -- the user's DDP settings ----------------------------------------------------------------

class LayerDrop(nn.Module):
    """LayerDrop (fairseq): each layer is skipped with probability 0.5 in training."""

    def __init__(self, layers: int = 6):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(layers))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            if not self.training or torch.rand([]) >= 0.5:
                x = torch.relu(layer(x))
        return self.head(x)


def test_layerdrop_is_judged_under_the_users_find_unused_parameters():
    plain = doctor(LayerDrop, torch.randn(8, 16))
    (err,) = [f for f in plain.errors if f.code == "rank-dependent-unused-parameters"]
    assert any("goes away under find_unused_parameters=True" in e for e in err.evidence)
    report = doctor(LayerDrop, torch.randn(8, 16), ddp_kwargs={"find_unused_parameters": True})
    assert report.errors == [] and report.exit_status == 0, report.text()
    (info,) = [f for f in report.findings if f.code == "rank-dependent-unused-parameters"]
    assert info.severity == "info" and "find_unused_parameters=True" in info.title
    assert "find_unused_parameters=True" in report.summary()


LAYERDROP_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class LayerDrop(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(6))
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            for layer in self.layers:
                if torch.rand([]) >= 0.5:
                    x = torch.relu(layer(x))
            return self.head(x)
''')


@pytest.mark.parametrize("ddp, status, message", [
    ("find_unused_parameters=True,static_graph=False", 0, ""),
    ("find_unused_parameters=maybe", 2, "--ddp"),
    ("bucket_cap=25", 2, "bucket_cap"),
    ("device_ids=[0]", 2, "device_ids"),
])
def test_cli_ddp_settings(tmp_path, capsys, ddp, status, message):
    path = tmp_path / "layerdrop.py"
    path.write_text(LAYERDROP_FILE)
    assert main([f"{path}:LayerDrop", "--input", "torch.randn(8, 16)", "--ddp", ddp]) == status
    assert message in capsys.readouterr().err


# 4 -- shapes and steps ------------------------------------------------------------------------

class CachedMask(nn.Module):
    """A causal mask cached in a buffer and rebuilt when the sequence length changes."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("mask", torch.zeros(0, 0), persistent=False)

    def forward(self, x):
        t = x.shape[1]
        if self.mask.shape[0] != t:
            self.mask = torch.full((t, t), float("-inf"), device=x.device).triu(1)
        att = (x @ x.transpose(1, 2) / 4 + self.mask).softmax(-1)
        return self.proj(att @ x)


def test_ranks_get_different_sequence_lengths_and_the_sized_buffer_shows():
    report = doctor(CachedMask, torch.randn(4, 12, 16))
    (f,) = [f for f in report.findings if f.code == "state-shape-follows-input"]
    assert "mask" in f.title and "broadcast_buffers" in "\n".join(f.evidence)
    # gloo aborts on size-mismatched collectives at some sizes: then the crash is its evidence
    assert f.severity == ("warning" if report.status == "ok" else "error"), report.text()
    assert report.codes() <= {"state-shape-follows-input"}, report.text()
    assert "rank 0: (12, 12), rank 1: (11, 11)" in "\n".join(f.evidence)
    assert any("dim 1: 12 on rank 0, 11 on rank 1" in n for n in report.notes)


def test_report_says_what_the_run_did_not_exercise():
    report = doctor(nn.Linear(16, 4), torch.randn(8, 16), steps=2)
    text = report.text()
    assert "not exercised:" in text and "after step 2" in text and "--steps" in text
    assert any("every rank gets the same shape" in n for n in report.notes)  # (8, 16): no other


# 5 -- mechanisms, not symptoms ----------------------------------------------------------------

class FrozenByRank(nn.Module):
    """Each rank freezes a different layer (a config read per rank): the same count and shapes."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        frozen = self.a if int(os.environ.get("RANK", "0")) == 0 else self.b
        frozen.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_requires_grad_that_differs_between_ranks_is_named_as_such():
    report = doctor(FrozenByRank, torch.randn(8, 16))
    (f,) = [f for f in report.errors if f.code == "requires-grad-differs-between-ranks"]
    assert "rank 0: a.bias, a.weight" in "\n".join(f.evidence)
    assert "outside __init__" not in _texts(report)


class StepInHook(nn.Module):
    """'Optimizer step in backward': the head's gradient is consumed by a post-accumulate hook."""

    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(16, 16), nn.Linear(16, 4)
        for p in self.head.parameters():
            p.register_post_accumulate_grad_hook(_sgd_step)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def _sgd_step(p):
    with torch.no_grad():
        p.add_(p.grad, alpha=-0.1)
    p.grad = None


def test_gradient_consumed_by_a_hook_is_not_called_unused():
    report = doctor(StepInHook, torch.randn(8, 16))
    assert "unused-parameters" not in report.codes(), report.text()
    (f,) = [f for f in report.errors if f.code == "gradient-consumed-by-hook"]
    assert "head.bias, head.weight" in "\n".join(f.evidence)
    assert "fails on the second step" not in _texts(report)


class ExtraOnRank1(nn.Module):
    """A layer that only one rank builds (a feature flag read per rank)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 16)
        if int(os.environ.get("RANK", "0")) == 1:
            self.extra = nn.Linear(16, 16)

    def forward(self, x):
        x = self.body(x)
        return self.extra(x) if hasattr(self, "extra") else x


def test_parameter_set_that_differs_between_ranks_gets_its_own_finding_and_fix():
    report = doctor(ExtraOnRank1, torch.randn(8, 16))
    (f,) = [f for f in report.errors if f.code == "model-differs-between-ranks"]
    assert f.lesson == "01" and f.fix
    assert "rank 1 has extra.bias, extra.weight, which rank 0 lacks" in "\n".join(f.evidence)
    assert "exception" not in report.codes()
