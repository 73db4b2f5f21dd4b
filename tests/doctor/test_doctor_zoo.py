"""A zoo of common architectures, built with random weights and no download, each diagnosed by
ONE doctor launch at a tiny size: no error-level false alarm, and the true findings where the
training loss ignores an output (a pooler, auxiliary heads).

torchvision and transformers do not install beside torch 2.13.0+cpu here, so the zoo is made of
small faithful re-creations (the same layer types and wiring); the real models run too where
those packages import (skipped with the reason otherwise). `python tests/doctor/test_doctor_zoo.py`
prints the doctor's wall time per model (docs/doctor.md's table)."""
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


# ---- the re-creations ----------------------------------------------------------------------

class BasicBlock(nn.Module):  # ResNet
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layers = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 16, 2), BasicBlock(16, 32, 2))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class InvertedResidual(nn.Module):  # MobileNetV2: expand, depthwise, project
    def __init__(self, c, expand=4):
        super().__init__()
        h = c * expand
        self.block = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return x + self.block(x)


class MobileNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8),
                                      nn.ReLU6(), InvertedResidual(8), InvertedResidual(8))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(8, classes))

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ViT(nn.Module):
    def __init__(self, size=16, patch=4, dim=32, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class GPT(nn.Module):  # a decoder whose output layer shares the embedding's weight
    def __init__(self, vocab=50, dim=32, max_len=32):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.tok.weight  # tied

    def forward(self, ids):
        t = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        return self.lm_head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


class BERT(nn.Module):  # an encoder that returns (sequence output, pooled output)
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.pooler = nn.Linear(dim, dim)
        self.mlm = nn.Linear(dim, vocab)

    def forward(self, ids):
        h = self.encoder(self.emb(ids))
        return self.mlm(h), torch.tanh(self.pooler(h[:, 0]))


def mlm_loss(out, ids):  # a masked-LM loss: the pooled output is not part of it
    return F.cross_entropy(out[0].reshape(-1, out[0].shape[-1]), ids.reshape(-1))


class GoogLeNet(nn.Module):  # Inception branches, and two auxiliary heads in training
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.b1, self.b3 = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 3, 1, 1)
        self.b5, self.bp = nn.Conv2d(16, 8, 5, 1, 2), nn.Conv2d(16, 8, 1)
        self.aux1, self.aux2 = nn.Linear(16, classes), nn.Linear(32, classes)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        s = self.stem(x)
        x = torch.cat([self.b1(s), self.b3(s), self.b5(s), self.bp(F.max_pool2d(s, 3, 1, 1))], 1)
        main = self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
        if not self.training:
            return main
        return main, self.aux1(s.mean((2, 3))), self.aux2(x.mean((2, 3)))


class LSTMLM(nn.Module):
    def __init__(self, vocab=50, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, num_layers=2, batch_first=True, dropout=0.1)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        h, _ = self.gru(h)
        return self.out(h)


class Wav2Vec(nn.Module):  # a conv feature encoder with GroupNorm, then a Transformer
    def __init__(self, dim=32):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, dim, 10, 5), nn.GroupNorm(dim, dim), nn.GELU(),
                                  nn.Conv1d(dim, dim, 3, 2), nn.GELU())
        self.proj = nn.LayerNorm(dim)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, wave):
        return self.encoder(self.proj(self.conv(wave.unsqueeze(1)).transpose(1, 2)))


class LayerDropEncoder(nn.Module):  # fairseq's LayerDrop
    def __init__(self, dim=32, layers=4, p=0.5):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, 4, dim * 2, batch_first=True) for _ in range(layers))
        self.p, self.head = p, nn.Linear(dim, 4)

    def forward(self, x):
        for layer in self.layers:
            if not self.training or torch.rand([]) >= self.p:
                x = layer(x)
        return self.head(x)


def _ids():
    return torch.randint(0, 50, (4, 12))


def _ce_main(out, batch):  # the training loss of a classifier with auxiliary heads, aux ignored
    return out[0].logsumexp(-1).mean()


# name: (model, input, doctor kwargs, the codes of the true error findings)
ZOO = {
    "resnet (BatchNorm, residual)": (ResNet, torch.randn(4, 3, 16, 16), {}, set()),
    "mobilenet (depthwise conv)": (MobileNet, torch.randn(4, 3, 16, 16), {}, set()),
    "vit": (ViT, torch.randn(2, 3, 16, 16), {}, set()),
    "gpt (tied embeddings)": (GPT, _ids(), {"loss_fn": lm_loss}, set()),
    "bert, loss on every output": (BERT, _ids(), {}, set()),
    "bert, masked-LM loss": (BERT, _ids(), {"loss_fn": mlm_loss}, {"unused-parameters"}),
    "googlenet, aux heads ignored": (GoogLeNet, torch.randn(4, 3, 8, 8), {"loss_fn": _ce_main},
                                     {"unused-parameters"}),
    "lstm/gru language model": (LSTMLM, _ids(), {"loss_fn": lm_loss}, set()),
    "wav2vec2 (conv + transformer)": (Wav2Vec, torch.randn(2, 400), {}, set()),
    "layerdrop, find_unused_parameters=True": (
        LayerDropEncoder, torch.randn(4, 6, 32), {"ddp_kwargs": {"find_unused_parameters": True}},
        set()),
}
TRUE_NAMES = {"bert, masked-LM loss": "pooler.bias, pooler.weight",
              "googlenet, aux heads ignored": "aux1.bias, aux1.weight, aux2.bias, aux2.weight"}


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo(name):
    model, example, kwargs, true_errors = ZOO[name]
    report = doctor(model, example, timeout=60, **kwargs)
    assert {f.code for f in report.errors} == true_errors, report.text()
    if name in TRUE_NAMES:
        (f,) = [f for f in report.errors if f.code == "unused-parameters"]
        assert f.evidence[0] == f"no gradient on any rank: {TRUE_NAMES[name]}"


def test_real_torchvision_models():
    tv = pytest.importorskip("torchvision", reason="torchvision does not install beside torch "
                             "2.13.0+cpu here (the zoo's re-creations stand in)")
    for build in (tv.models.resnet18, tv.models.mobilenet_v3_small):
        report = doctor(lambda: build(weights=None, num_classes=10), torch.randn(2, 3, 32, 32))
        assert report.errors == [], report.text()


def test_real_transformers_models():
    tr = pytest.importorskip("transformers", reason="transformers does not install beside torch "
                             "2.13.0+cpu here (the zoo's re-creations stand in)")
    config = tr.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64)
    report = doctor(lambda: tr.BertModel(config), torch.randint(0, 50, (2, 12)),
                    loss_fn=lambda out: out.last_hidden_state.pow(2).mean())
    assert {f.code for f in report.errors} == {"unused-parameters"}, report.text()


if __name__ == "__main__":  # docs/doctor.md's table: the doctor's wall time per model
    doctor(nn.Linear(4, 4), torch.randn(2, 4))  # fork server and the doctor's imports, once
    for name, (model, example, kwargs, _) in ZOO.items():
        start = time.time()
        report = doctor(model, example, timeout=60, **kwargs)
        seconds = time.time() - start
        found = ", ".join(f"{f.severity} {f.code}" for f in report.findings) or "none"
        print(f"| {name} | {seconds:.1f} s | {found} |")
