"""No false alarms: ordinary modules get no error and no warning from the doctor on real ranks
(a BatchNorm note is fine)."""
import pytest
import torch
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def transformer():
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def lstm():
    return nn.LSTM(16, 8, num_layers=2)  # output: (out, (h, c)), every one a floating tensor


CASES = {
    "mlp": (mlp, torch.randn(8, 16)),
    "cnn-batchnorm": (cnn, torch.randn(4, 3, 12, 12)),
    "transformer-encoder": (transformer, torch.randn(2, 5, 16)),
    "lstm": (lstm, torch.randn(5, 3, 16)),
    "tokens-and-mask": (lambda: TokenModel(), (torch.randint(0, 50, (4, 6)), torch.ones(4, 6))),
    "dropout-and-noise": (lambda: NoisyDropout(), torch.randn(8, 16)),
}


class NoisyDropout(nn.Module):
    """Random draws from torch's default generator in forward (dropout, noise): each rank its
    own, so lesson 14's checks stay silent."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        h = self.drop(torch.relu(self.lin(x)))
        return h + 0.01 * torch.randn_like(h)


class TokenModel(nn.Module):
    """Embedding ids (an integer input, rolled per rank) and a float mask: two positional args."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, ids, mask):
        h = self.emb(ids) * mask.unsqueeze(-1)
        return {"logits": self.head(h.mean(1)), "pooled": h.mean(1)}


@pytest.mark.parametrize("name", CASES)
def test_no_error_or_warning_on_ordinary_modules(name):
    make, example = CASES[name]
    report = doctor(make, example)
    assert report.status == "ok", report
    assert report.of("error") == [] and report.of("warning") == [], report
    assert report.exit_status == 0


def test_batchnorm_gets_a_note_with_its_measured_drift():
    report = doctor(cnn, torch.randn(4, 3, 12, 12))
    (note,) = report.findings
    assert (note.severity, note.code, note.lesson) == ("info", "batchnorm-buffers-differ", "08")
    assert note.evidence[0] == "values per channel each rank normalises over: 1 400, 4 256"
    drifts = [float(e.rsplit(" ", 1)[1]) for e in note.evidence if "max |difference|" in e]
    assert len(drifts) == 4 and drifts == sorted(drifts, reverse=True) and drifts[-1] > 0


def test_small_per_rank_batch_makes_the_batchnorm_note_a_warning():
    model = lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    (warn,) = doctor(model, torch.randn(4, 4)).findings
    assert (warn.severity, warn.code) == ("warning", "batchnorm-small-per-rank-batch")
    assert warn.title == "BatchNorm normalises over only 4 value(s) per channel on each rank"
