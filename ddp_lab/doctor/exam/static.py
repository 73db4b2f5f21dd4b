"""Static checks: one instance of the module, inspected in this process (no ranks, no forward).

Each check takes the model and returns a list of Findings."""
from __future__ import annotations

import inspect
import re

from ...instruments.modwalk import Hidden, hidden
from ..report import Finding

_HARD_DEVICE = re.compile(r"""\.cuda\(|['"]cuda(:\d+)?['"]|device\s*=\s*['"]cpu['"]|"""
                          r"""torch\.device\(\s*['"]cpu['"]""")
MAX_NAMES = 8


def names(items, limit: int = MAX_NAMES) -> str:
    items = list(items)
    more = f" (and {len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(map(str, items[:limit])) + more


def _shape(t) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def unregistered_trainable(found: list[Hidden]) -> list[Finding]:
    bad = [h for h in found if h.kind == "tensor" and h.container == "attribute" and h.trainable]
    if not bad:
        return []
    return [Finding(
        "error", "unregistered-trainable-tensor", "01",
        f"{len(bad)} tensor(s) with requires_grad=True kept as plain attributes",
        [f"{h.name}: {_shape(h.value)}, requires_grad=True, not in parameters()" for h in bad]
        + ["no optimizer built from parameters() updates them, DDP neither broadcasts them nor "
           "averages their gradients, and state_dict() does not save them"],
        "make each one a parameter: self.w = nn.Parameter(torch.randn(...)) (assigning an "
        "nn.Parameter to an attribute registers it)")]


def in_containers(found: list[Hidden]) -> list[Finding]:
    trainable = [h for h in found if h.container != "attribute" and h.trainable]
    if not trainable:
        return []
    kinds = {h.container for h in trainable}
    return [Finding(
        "error", "module-in-plain-container", "01",
        f"{len(trainable)} sub-module(s) or parameter(s) kept in a plain {'/'.join(sorted(kinds))}",
        [f"{h.name}: {h.kind} in a plain {h.container}" for h in trainable]
        + ["nn.Module does not look inside Python containers: these parameters are missing "
           "from parameters(), state_dict(), .to() and DDP's gradient all-reduce"],
        "use nn.ModuleList / nn.ModuleDict for sub-modules and nn.ParameterList / "
        "nn.ParameterDict for parameters")]


def plain_tensors(found: list[Hidden]) -> list[Finding]:
    plain = [h for h in found if h.kind == "tensor" and not h.trainable]
    plain += [h for h in found if h.kind == "module" and not h.trainable
              and any(True for _ in h.value.buffers())]
    if not plain:
        return []
    return [Finding(
        "warning", "plain-tensor-attribute", "02",
        f"{len(plain)} tensor(s) kept as plain attributes instead of buffers",
        [f"{h.name}: {_shape(h.value) if h.kind == 'tensor' else 'module with buffers'}"
         f"{'' if h.container == 'attribute' else ' in a plain ' + h.container}" for h in plain]
        + ["module.to(device) does not move them, DDP does not broadcast them, state_dict() "
           "does not save them"],
        'self.register_buffer("name", tensor) (persistent=False if it should not be saved)')]


def hard_coded_devices(model, found: list[Hidden]) -> list[Finding]:
    evidence = [f"{h.name} = {h.value!r}" for h in found if h.kind == "device"]
    evidence += source_devices(model)
    if not evidence:
        return []
    return [Finding(
        "warning", "hard-coded-device", "02", "a device is hard-coded in the module",
        evidence + ["each rank needs its own device (cuda:LOCAL_RANK); a fixed one puts "
                    "every rank on the same GPU, or breaks on a machine without it"],
        "build the module on the CPU and move it whole with module.to(device); inside forward "
        "create tensors from the input: x.new_zeros(...), torch.zeros(..., device=x.device)")]


def source_devices(model) -> list[str]:
    """Lines of the model's own classes that name a device literally."""
    out, seen = [], set()
    for m in model.modules():
        cls = type(m)
        if cls in seen or cls.__module__.split(".")[0] == "torch":
            continue
        seen.add(cls)
        for meth in ("__init__", "forward"):
            fn = cls.__dict__.get(meth)
            try:
                lines, start = inspect.getsourcelines(fn)
            except (TypeError, OSError):
                continue
            for i, line in enumerate(lines):
                code = line.split("#")[0]
                if _HARD_DEVICE.search(code):
                    out.append(f"{cls.__name__}.{meth}, line {start + i}: {line.strip()}")
    return out


def mixed_placement(model) -> list[Finding]:
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    devices = sorted({str(t.device) for _, t in tensors})
    findings = []
    if len(devices) > 1:
        findings.append(Finding(
            "error", "mixed-devices", "02", f"parameters and buffers on {len(devices)} devices",
            [f"{d}: {names(n for n, t in tensors if str(t.device) == d)}" for d in devices],
            "create everything on one device (the CPU), then move the module with .to(device)"))
    floats = [(n, t) for n, t in tensors if t.is_floating_point()]
    dtypes = sorted({str(t.dtype).replace("torch.", "") for _, t in floats})
    if len(dtypes) > 1:
        findings.append(Finding(
            "warning", "mixed-dtypes", "02", f"floating parameters and buffers in {len(dtypes)} dtypes",
            [f"{d}: {names(n for n, t in floats if str(t.dtype).endswith(d))}" for d in dtypes]
            + ["ops that mix them raise a dtype error, or promote silently"],
            "keep one dtype in the module (module.to(dtype)); use torch.autocast for mixed precision"))
    return findings


def low_precision(model) -> list[Finding]:
    import torch

    low = [(n, p) for n, p in model.named_parameters()
           if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)]
    if not low:
        return []
    dtypes = sorted({str(p.dtype).replace("torch.", "") for _, p in low})
    return [Finding(
        "warning", "low-precision-parameters", "04",
        f"{len(low)} trainable parameter(s) stored in {'/'.join(dtypes)}",
        [names(n for n, _ in low)] + [
            "an optimizer step smaller than the weight's last bit (1/256 of it in bfloat16) "
            "rounds away, so small updates are lost; float32 inputs then fail with a dtype error"],
        "keep parameters in float32 and run forward under torch.autocast (it casts each op's "
        "inputs); for fp16 add torch.amp.GradScaler")]


def static_findings(model) -> list[Finding]:
    """Every static check on one instance: its findings."""
    found = hidden(model)
    return (unregistered_trainable(found) + in_containers(found) + plain_tensors(found)
            + hard_coded_devices(model, found) + mixed_placement(model) + low_precision(model))
