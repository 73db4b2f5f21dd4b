"""The doctor's static checks, its input handling and its report: one instance, no processes."""
import json

import pytest
import torch
from torch import nn

from ddp_lab.doctor import DoctorInputError, Finding, Report, doctor
from ddp_lab.doctor.exam import static
from ddp_lab.doctor.exam.inputs import validate_fit, default_loss, perturb, resolve_model
from ddp_lab.instruments.modwalk import hidden, hidden_tensors


class Messy(nn.Module):
    """Every static problem at once."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gain = torch.ones(4, requires_grad=True)  # trainable, unregistered
        self.mask = torch.ones(4)  # should be a buffer
        self.blocks = [nn.Linear(4, 4)]  # module in a plain list
        self.table = {"w": nn.Parameter(torch.ones(4))}  # parameter in a plain dict
        self.device = "cuda:0"  # hard-coded device
        self.aliases = [self.lin]  # a second reference to a registered module: fine

    def forward(self, x):
        return self.blocks[0](self.lin(x)) * self.gain * self.mask * self.table["w"]


class Clean(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("mask", torch.ones(4))
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        return self.blocks[0](self.lin(x)) * self.mask


def by_code(findings):
    return {f.code: f for f in findings}


def test_walk_finds_everything_unregistered_and_nothing_registered():
    found = {h.name: h for h in hidden(Messy())}
    assert set(found) == {"gain", "mask", "blocks[0]", "table['w']", "device"}
    assert (found["blocks[0]"].kind, found["blocks[0]"].container) == ("module", "list")
    assert (found["table['w']"].kind, found["table['w']"].container) == ("parameter", "dict")
    assert found["gain"].trainable and not found["mask"].trainable
    assert set(hidden_tensors(Messy())) == {"gain", "mask", "blocks[0].weight", "blocks[0].bias",
                                            "table['w']"}
    assert hidden(Clean()) == []


def test_static_checks_name_each_problem_with_its_lesson():
    found = by_code(static.static_findings(Messy()))
    assert set(found) == {"unregistered-trainable-tensor", "module-in-plain-container",
                          "plain-tensor-attribute", "hard-coded-device"}
    assert found["unregistered-trainable-tensor"].severity == "error"
    assert found["unregistered-trainable-tensor"].lesson == "01"
    assert "gain" in found["unregistered-trainable-tensor"].evidence[0]
    assert {e.split(":")[0] for e in found["module-in-plain-container"].evidence[:2]} == {
        "blocks[0]", "table['w']"}
    assert found["plain-tensor-attribute"].lesson == "02"
    assert found["plain-tensor-attribute"].severity == "warning"
    device_ev = " ".join(found["hard-coded-device"].evidence)
    assert "device = 'cuda:0'" in device_ev and 'self.device = "cuda:0"' in device_ev


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
    lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()),
    lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2),
    lambda: nn.LSTM(16, 8, 2),
    Clean,
], ids=["mlp", "cnn-bn", "transformer", "lstm", "clean"])
def test_no_static_findings_on_ordinary_modules(make):
    assert static.static_findings(make()) == []


def test_mixed_dtypes_are_a_warning():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double())
    (f,) = static.static_findings(model)
    assert (f.code, f.severity, f.lesson) == ("mixed-dtypes", "warning", "02")
    assert "float64: 1.weight, 1.bias" in f.evidence


def test_perturb_makes_rank_distinct_inputs_and_keeps_rank0():
    x = torch.randn(8, 4)
    ids = torch.arange(8)
    assert torch.equal(perturb(x, 0), x)
    assert not torch.allclose(perturb(x, 1), x)
    assert torch.equal(perturb(x, 1), perturb(x, 1))  # deterministic
    assert sorted(perturb(ids, 1).tolist()) == list(range(8)) and not torch.equal(perturb(ids, 1), ids)
    pair = perturb((x, ids, "keep"), 1)
    assert pair[2] == "keep" and not torch.equal(pair[0], x)


def test_default_loss_sums_every_floating_output_and_reaches_layers_under_layernorm():
    out = {"a": torch.ones(2, 3, requires_grad=True), "b": (torch.ones(2), torch.arange(3))}
    loss = default_loss(out)
    loss.backward()
    assert out["a"].grad is not None and out["a"].grad.abs().sum() > 0
    lin, norm = nn.Linear(8, 8), nn.LayerNorm(8)
    default_loss(norm(lin(torch.randn(4, 8)))).backward()
    assert lin.weight.grad.abs().max() > 1e-4  # a plain sum would give ~0 here
    with pytest.raises(DoctorInputError, match="no floating-point tensor"):
        default_loss((torch.arange(3),))


def test_resolve_model_kinds_and_names():
    assert resolve_model(Clean).kind == "class"
    assert resolve_model(lambda: Clean()).kind == "factory"
    inst = resolve_model(Clean())
    assert inst.kind == "instance" and inst.build() is not inst.obj  # a copy
    with pytest.raises(DoctorInputError, match="not an nn.Module subclass"):
        resolve_model(int)
    with pytest.raises(DoctorInputError, match="must be an nn.Module class"):
        resolve_model(3)


@pytest.mark.parametrize("make, example, match", [
    (lambda: nn.Linear(3, 4), torch.randn(8, 16), r"does not fit .*shapes cannot be multiplied \(8x16 and 3x4\)"),
    (lambda: nn.Linear(16, 4), (torch.randn(8, 16), torch.randn(8, 16)), "does not fit .*positional argument"),
    (lambda: nn.Embedding(4, 2), torch.arange(8), "does not fit .*index out of range"),
])
def test_input_that_does_not_fit_is_bad_input(make, example, match):
    with pytest.raises(DoctorInputError, match=match):
        validate_fit(make(), example, "M", None, None)


def test_bad_input_is_refused_before_any_rank_starts():
    class NoParams(nn.Module):
        def forward(self, x):
            return x * 2

    def factory():
        raise ValueError("no such layer size")

    with pytest.raises(DoctorInputError, match="no parameter that requires a gradient"):
        doctor(NoParams, torch.randn(2, 2))
    with pytest.raises(DoctorInputError, match="building factory\\(\\) raised ValueError: no such layer size"):
        doctor(factory, torch.randn(2, 2))
    with pytest.raises(DoctorInputError, match="amp must be one of"):
        doctor(Clean, torch.randn(2, 4), amp="fp8")
    with pytest.raises(DoctorInputError, match="timeout must be at least 3"):
        doctor(Clean, torch.randn(2, 4), timeout=1)


def test_report_orders_renders_and_serialises():
    findings = [Finding("info", "n", "08", "a note"),
                Finding("error", "e", "01", "an error", ["x.weight"], "fix it", trace="line\n" * 30),
                Finding("warning", "w", "03", "a warning")]
    report = Report("Net", 2, 3, findings=findings)
    assert [f.severity for f in report.findings] == ["error", "warning", "info"]
    assert report.exit_status == 1 and report.lessons() == {"01", "03"}
    text = repr(report)
    assert text.startswith("doctor: Net (world size 2, 3 steps, ranks ok): 1 error, 1 warning, 1 info")
    assert "[01 parameter registration] e: an error" in text and "... (18 lines;" in text
    assert report.text(traces=True).count("| line") == 30
    data = json.loads(report.to_json())
    assert data["exit_status"] == 1 and data["findings"][0]["error_class"] == "parameter registration"
    assert "<table" in report._repr_html_() and "<details style=" in report._repr_html_()
    assert Report("Net", 2, 3).exit_status == 0
    with pytest.raises(ValueError, match="lesson must be one of"):
        Finding("error", "x", "11", "no such lesson")


def test_doctor_is_a_function_of_the_package():
    # ddp_lab exports the package itself, callable as the function (issue 38, point 15: when
    # ddp_lab.doctor was the function, `import ddp_lab.doctor.exam.sharded as s` failed)
    import inspect

    import ddp_lab
    import ddp_lab.doctor as package
    from ddp_lab.doctor import cli  # a submodule imported: the package stays the package

    assert package is ddp_lab.doctor and callable(package) and package.doctor is doctor
    assert inspect.isfunction(doctor) and package.__name__ == cli.__package__
    assert doctor.__module__.startswith(package.__name__ + ".")  # its run: doctor/exam/run.py
    assert inspect.signature(package) == inspect.signature(doctor)
