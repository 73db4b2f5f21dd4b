"""The user's DDP settings, checked against DDP's own signature, and what a doctor run assumed
and did not exercise (the report's notes)."""
from __future__ import annotations

import inspect

from ..errors import DoctorInputError

RESERVED_DDP = ("module", "device_ids", "output_device", "process_group", "device_mesh")


def validated_ddp_kwargs(ddp_kwargs) -> dict:
    """The user's DistributedDataParallel keyword arguments, validated against DDP's signature
    (the doctor sets the module, devices and process group itself)."""
    from torch.nn.parallel import DistributedDataParallel

    if ddp_kwargs is None:
        return {}
    if not isinstance(ddp_kwargs, dict):
        raise DoctorInputError(f"ddp_kwargs must be a dict, got {type(ddp_kwargs).__name__}")
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    for key, value in ddp_kwargs.items():
        if key in RESERVED_DDP:
            raise DoctorInputError(f"ddp_kwargs: {key} is set by the doctor (one device and "
                                   "process group per rank); leave it out")
        if key not in params or key == "self":
            known = ", ".join(k for k in params if k not in ("self",) + RESERVED_DDP)
            raise DoctorInputError(f"ddp_kwargs: DistributedDataParallel has no argument "
                                   f"{key!r}; it takes: {known}")
        if isinstance(params[key].default, bool) and not isinstance(value, bool):
            raise DoctorInputError(f"ddp_kwargs: {key} must be True or False, got {value!r}")
    return dict(ddp_kwargs)


def settings_note(settings: dict) -> str:
    if settings:
        return f"DDP: judged under your settings {', '.join(f'{k}={v!r}' for k, v in settings.items())}"
    return ("DDP: judged under the defaults (find_unused_parameters=False, static_graph=False); "
            "give yours with ddp_kwargs (--ddp)")


def not_exercised(steps: int, amp: str | None, strategy: str = "ddp") -> str:
    """What the run did not exercise. The checkpoint round trip (save_load.py) saves and reloads
    the module's state dict under every strategy but zero3; a training loop's checkpoint holds
    more (the optimizer's state, the RNG states), which no phase saves."""
    saving = ("saving and loading" if strategy == "zero3" else
              "saving and loading beyond the module's state dict (the optimizer's state, the RNG "
              "states; the round trip saved and reloaded the module's state dict)")
    parts = [f"anything after step {steps} (freezing, schedules, warm-up: raise steps, --steps)",
             "evaluation mode (except for collectives)", "gradient accumulation (no_sync)",
             saving, "NCCL and GPUs (the ranks ran on the CPU with gloo)"]
    parts += [] if amp else ["autocast (amp, --amp)"]
    return "not exercised: " + "; ".join(parts)
