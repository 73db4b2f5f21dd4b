"""The bf16 tables check (`strategy="fsdp2"`, `amp="bf16"`; issue 24): FSDP2's
MixedPrecisionPolicy casts each unit's floating-point inputs to bfloat16, so a table the module
builds from the input's dtype (rotary angles, positions, scales: `torch.arange(T,
dtype=x.dtype)`) is computed in bf16, whose 8 bits of mantissa cannot count past 256. The
check compares outputs, not dtypes: the sharded bf16 forward against the same weights run whole
in float32, and names the low-precision tables forward built (the user's line).
"""
from __future__ import annotations

from ..batch import call, floating_tensors
from ..frames import user_frame
from ..report import Finding

# Relative (L2) error of the output above which it is more than bf16's rounding: bf16 keeps 8
# significant bits (unit roundoff 2**-8 = 0.0039); a few layers of it give ~0.01. Measured on
# a rotary block over 512 positions: 0.0066 with its table in float32, 0.84 with it in bf16.
TOLERANCE = 0.05
TABLES = {"arange", "linspace", "logspace", "outer", "ones", "zeros", "full", "tensor"}


def same_weights(model) -> None:
    """Rank 0's parameters and buffers on every rank (as DDP would do), so that the sharded
    module is the one this rank runs whole."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def reference(model, batch) -> list:
    """The module's floating-point outputs in float32, whole, before it is sharded."""
    import torch

    with torch.no_grad():
        return [t.detach().float().clone() for t in floating_tensors(call(model, batch))]


def relative_error(out, ref: list) -> float:
    """max over the outputs of ||out - ref|| / ||ref|| (float32)."""
    import torch

    outs = [t.detach().float() for t in floating_tensors(out)]
    errs = [float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))
            for o, r in zip(outs, ref)]
    return max(errs, default=0.0)


def low_precision_tables():
    """A TorchFunctionMode recording `.calls`: (function, dtype, the user's line) for each table
    (arange, outer, ...) that forward builds in bf16 or fp16."""
    import torch
    from torch.overrides import TorchFunctionMode

    low = (torch.bfloat16, torch.float16)

    class Tables(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls: list[tuple[str, str, str]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in TABLES and isinstance(out, torch.Tensor) and out.dtype in low:
                call = (name, str(out.dtype).removeprefix("torch."), user_frame())
                if call[2] and call not in self.calls:
                    self.calls.append(call)
            return out

    return Tables()


def table_findings(v: dict) -> list[Finding]:
    """The finding from a rank's record: {"error": relative error, "tables": calls}."""
    err = v.get("bf16_error")
    if err is None or err <= TOLERANCE:
        return []
    tables = v.get("bf16_tables") or []
    return [Finding(
        "error", "bf16-table-error", "04",
        "under FSDP2's bf16 policy the output is far from the float32 run",
        [f"relative error of the output against float32 (same weights): {err:.2g}, above "
         f"bf16's rounding (threshold {TOLERANCE:g})"]
        + [f"{name}() built in {dtype} in forward: {where}" for name, dtype, where in tables[:4]]
        + ["FSDP2 casts each unit's inputs to bf16, so tables built from the input's dtype "
           "(positions, angles, scales) are computed in bf16: it counts integers exactly only "
           "up to 256"],
        fix="build tables in float32 (torch.arange(T, device=x.device, dtype=torch.float32)), "
            "apply them in float32 and cast the result to the activation's dtype")]
