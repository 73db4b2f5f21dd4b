"""The bf16 tables check (doctor/exam/precision.py): under FSDP2's bf16 policy a rotary table built
in the input's dtype is reported with its measured error against float32; built in float32, it
is not."""
import torch
from torch import nn

from ddp_lab.doctor import doctor
from ddp_lab.doctor.exam.precision import TOLERANCE

T = 2048  # positions: bf16 counts integers exactly only up to 256


class Rotary(nn.Module):
    """A projection, then rotary position angles applied to it."""

    table_dtype = None  # None: the input's dtype (the bug)

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8) / 8))

    def forward(self, x):
        h = self.proj(x)
        dtype = self.table_dtype or h.dtype
        pos = torch.arange(x.shape[1], device=x.device, dtype=dtype)
        angles = torch.outer(pos, self.inv_freq.to(dtype))
        a, b = h[..., :8], h[..., 8:]
        out = torch.cat([a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()], -1)
        return out.to(h.dtype)


class RotaryFloat32(Rotary):
    table_dtype = torch.float32


def _bf16(model):
    return doctor(model, torch.randn(2, T, 16), strategy="fsdp2", amp="bf16", world_size=2,
                  steps=1, timeout=90)


def test_table_in_the_inputs_dtype_is_reported_with_its_error():
    report = _bf16(Rotary)
    [f] = [f for f in report.findings if f.code == "bf16-table-error"]
    assert f.severity == "error" and f.strategies == ("fsdp2",)
    err = float(f.evidence[0].split("float32 (same weights): ")[1].split(",")[0])
    assert err > 4 * TOLERANCE, f.evidence
    assert any("arange() built in bfloat16 in forward: Rotary.forward" in e for e in f.evidence)


def test_table_in_float32_is_silent():
    report = _bf16(RotaryFloat32)
    assert "bf16-table-error" not in report.codes(), report.text()
