"""What `watch` measures inside a rank around the user's own training step, as plain data:
a hash per parameter and buffer, a hash of the generator state each dropout mask is drawn
from, the loss each backward ran from,
and the reads of sharded parameters outside forward (placeholders or DTensor shards) with the
user's line. Nothing here calls a collective: the ranks compare notes in the parent."""
from __future__ import annotations

import sys

from ..checks.api import digest
from ..frames import in_optimizer, user_frame



def state_hashes(model, strategy: str) -> dict[str, str]:
    """name -> hash of every parameter (DDP: replicas) and buffer. Under FSDP2 and ZeRO-3 each
    rank holds a different shard of a parameter by design: only buffers are compared."""
    out = {f"buffer {n}": digest(b) for n, b in model.named_buffers()}
    if strategy == "ddp":
        out.update({f"parameter {n}": digest(p) for n, p in model.named_parameters()})
    return out


def dropout_hooks(model, masks: dict):
    """Forward pre-hooks on every nn.Dropout in training mode: masks[name] = a hash of the state
    of the generator its mask is drawn from (equal states draw equal masks)."""
    import torch

    def hook(name):
        def record(module, args):
            if module.training and module.p > 0 and args and isinstance(args[0], torch.Tensor):
                x = args[0]
                state = (torch.cuda.get_rng_state(x.device) if x.is_cuda else torch.get_rng_state())
                masks[name] = digest(state)
        return record

    return [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Dropout)]


def _sharded_placeholder(p) -> str:
    """'ZeRO-3 placeholder (0,)', 'DTensor shard', or '' for a parameter read whole."""
    if hasattr(p, "ds_status") and p.numel() == 0:
        return f"a ZeRO-3 placeholder of shape {tuple(p.shape)} (the weight is {tuple(p.ds_shape)})"
    if type(p).__name__ == "DTensor" or hasattr(p, "_local_tensor"):
        return (f"a DTensor (this rank's shard {tuple(p.to_local().shape)} of "
                f"{tuple(p.shape)}, {p.placements})")
    return ""


def step_watcher(model):
    """A TorchFunctionMode recording, while the step runs: `.losses` (the value of each tensor
    backward ran from) and `.reads` ((parameter, what it was, the user's line) for each read of
    a sharded parameter that was not gathered, i.e. outside forward)."""
    import torch
    from torch.overrides import TorchFunctionMode

    names = {id(p): n for n, p in model.named_parameters()}

    class Watcher(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.losses: list[float] = []
            self.reads: list[tuple[str, str, str]] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.backward and args:
                self.losses.append(float(args[0].detach().float().sum()))
            for a in args:
                if id(a) in names and len(self.reads) < 20:
                    self._read(a)
            return func(*args, **(kwargs or {}))

        def _read(self, p):
            what = _sharded_placeholder(p)
            frame = sys._getframe(2)
            if what and not in_optimizer(frame):
                read = (names[id(p)], what, user_frame(frame))
                if read not in self.reads:
                    self.reads.append(read)

    return Watcher()
