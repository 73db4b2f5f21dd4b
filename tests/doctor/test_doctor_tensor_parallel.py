"""The doctor's `strategy="tp"` (doctor/exam/tensor_parallel.py, tp_plan.py): the plan it traces when asked
(tp_plan="traced"), a user's plan and parallelize function from Python and from the command
line, no plan at all, and bad input. The lesson-16 ModuleCases
(every lesson-16 module, broken and fixed) are checked by test_doctor_registry."""
import textwrap

import pytest
import torch
from torch import nn

from ddp_lab.doctor import DoctorInputError, doctor
from ddp_lab.doctor.cli import main
from ddp_lab.doctor.exam.tp_plan import default_plan
from ddp_lab.lessons.l16_tensor_parallel_and_checkpoints import modules as m


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.sigmoid(self.gate(x)) * self.up(x))


class Leaky(nn.Module):
    """The hidden features leave the module directly too: splitting `up` would change them."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x):
        h = self.up(x)
        return self.down(h), h


def test_the_default_plan_pairs_each_split_linear_with_the_one_its_output_reaches():
    x = torch.randn(2, 8)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 8))
    assert default_plan(mlp, x) == {"0": "colwise", "2": "rowwise"}
    assert default_plan(Gated(), x) == {"down": "rowwise", "gate": "colwise", "up": "colwise"}
    assert default_plan(Leaky(), x) == {}


def test_the_default_plan_is_the_lesson_blocks_own():
    plan = default_plan(m.AttentionFixed(), m.features(0))
    assert plan == {n: type(s).__name__.removesuffix("Parallel").lower()
                    for n, s in m.AttentionFixed().tp_plan().items()}
    lm = default_plan(m.TinyLM(), m.tokens(0))
    assert lm == {n: type(s).__name__.removesuffix("Parallel").lower()
                  for n, s in m.TinyLM().tp_plan().items()}


def test_your_plan_is_used_and_a_split_norm_is_found():
    report = doctor(m.NormedMLPFixed, m.features, strategy="tp", timeout=60,
                    tp_plan={"up": "colwise", "down": "rowwise"})
    [f] = [f for f in report.errors if f.lesson == "16"]
    assert f.code == "tp-output-differs"
    assert f.evidence[-1] == "plan (yours): up: colwise, down: rowwise"
    assert any(e.startswith("output at step 1 differs by ") for e in f.evidence[:-1])


MODULES = textwrap.dedent('''
    import torch
    from torch import nn

    class Normed(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

        def forward(self, x):
            h = self.up(x)
            return self.down(h / h.norm(dim=-1, keepdim=True))


    def split(model, mesh):
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        plan = {"up": ColwiseParallel(use_local_output=False), "down": RowwiseParallel()}
        return parallelize_module(model, mesh, plan)
''')


def test_cli_takes_tp_a_plan_and_a_parallelize_function(tmp_path, capsys):
    path = tmp_path / "normed.py"
    path.write_text(MODULES)
    target = f"{path}:Normed"
    assert main([target, "--input", "torch.randn(4, 8)", "--strategy", "tp"]) == 0
    out = capsys.readouterr().out
    assert "tp-needs-plan" in out and "tp-output-differs" not in out
    assert main([target, "--input", "torch.randn(4, 8)", "--strategy", "tp",
                 "--tp-plan", "'traced'"]) == 1
    assert "tp-output-differs" in capsys.readouterr().out
    plan = "{'up': ColwiseParallel(use_local_output=False), 'down': RowwiseParallel()}"
    assert main([target, "--input", "torch.randn(4, 8)", "--strategy", "tp",
                 "--tp-plan", plan]) == 0
    assert "plan (yours): up: ColwiseParallel, down: RowwiseParallel" in capsys.readouterr().out
    assert main([target, "--input", "torch.randn(4, 8)", "--strategy", "tp",
                 "--parallelize", "split"]) == 0
    assert "plan (yours: split(model, mesh))" in capsys.readouterr().out


def test_bad_tp_input_is_refused_before_any_launch():
    with pytest.raises(DoctorInputError, match="tp_plan is used with strategy='tp' only"):
        doctor(m.NormedMLP, m.features, tp_plan={"up": "colwise"})
    with pytest.raises(DoctorInputError, match="amp is not checked under strategy='tp'"):
        doctor(m.NormedMLP, m.features, strategy="tp", amp="bf16")
    with pytest.raises(DoctorInputError, match="tp_plan must be a dict"):
        doctor(m.NormedMLP, m.features, strategy="tp", tp_plan=["up"])
    with pytest.raises(DoctorInputError, match="parallelize is used with strategy='tp' only"):
        doctor(m.NormedMLP, m.features, parallelize=lambda model, mesh: model)
    with pytest.raises(DoctorInputError, match="give tp_plan or parallelize, not both"):
        doctor(m.NormedMLP, m.features, strategy="tp", tp_plan={"up": "colwise"},
               parallelize=lambda model, mesh: model)
