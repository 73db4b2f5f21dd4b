"""Which lesson teaches an exception a rank raised: PyTorch's message, matched against the error
classes of the course, with the fix each lesson arrives at."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    pattern: str
    lesson: str
    code: str
    fix: str
    amp_lesson: str | None = None  # the lesson instead, when the run used autocast


RULES = (
    Rule(r"DDP expects same model across all ranks", "01", "model-differs-between-ranks",
         "build the same module on every rank, with the same parameters trainable: no layer, "
         "size or requires_grad that depends on the rank, the host or per-rank data"),
    Rule(r"Expected to have finished reduction|did not receive grad|find_unused_parameters",
         "01", "unused-parameters",
         "use every parameter in forward on every rank (or delete it); if some truly go unused, "
         "DDP(find_unused_parameters=True) (slower) or static_graph=True"),
    Rule(r"doesn't have any parameter that requires a gradient", "01", "no-trainable-parameters",
         "register the trainable tensors as nn.Parameter so DDP can see them"),
    Rule(r"CheckpointError|Recomputed values for the following tensors", "05",
         "checkpoint-recomputation-differs",
         "a checkpointed function must compute the same thing when backward reruns it: move "
         "side effects (appends, counters, buffer updates) out of the region"),
    Rule(r"mark a variable ready only once|marked ready|[Rr]eentrant|checkpoint", "05",
         "checkpoint-under-ddp",
         "torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False), each region run "
         "once per step, with no side effects; or DDP(static_graph=True)"),
    Rule(r"modified by an inplace operation", "05", "inplace-modification",
         "do not edit in place a tensor autograd saved: write y = x * 2 instead of x.mul_(2) "
         "(set torch.autograd.set_detect_anomaly(True) to find the op)"),
    Rule(r"backward through the graph a second time|already been freed", "05", "backward-twice",
         "do not keep graph outputs across steps: store .detach()ed tensors in the module; "
         "retain_graph=True only hides this and grows memory"),
    Rule(r"does not require grad and does not have a grad_fn", "05", "no-gradient-path",
         "keep the output connected to the parameters: no torch.no_grad(), .detach() or .data in "
         "forward; a reentrant checkpoint whose inputs need no gradient cuts the graph: "
         "checkpoint(fn, x, use_reentrant=False)"),
    Rule(r"same device|on device|device type|Expected .*cuda|cpu and cuda|cuda and cpu", "02",
         "device-mismatch",
         "create tensors in forward from the input (x.new_zeros, device=x.device), keep "
         "constants as buffers, and move the whole module with .to(device)"),
    Rule(r"dtype|scalar type|BFloat16|Half\b|Float but|Double", "02", "dtype-mismatch",
         "give tensors created in forward the input's dtype (dtype=x.dtype); for custom autograd "
         "Functions under autocast decorate forward/backward with torch.amp.custom_fwd/custom_bwd",
         amp_lesson="04"),
    Rule(r"[Tt]imed out|[Tt]imeout|Connection|gloo|NCCL|collective|monitoredBarrier|process group",
         "03", "collective-failure",
         "call every collective on every rank, in the same order, with the same shapes; never "
         "inside `if rank == 0:`"),
)
DEFAULT = Rule("", "06", "exception",
               "read the root-cause rank's traceback first: later failures on other ranks are "
               "usually consequences")


def classify(message: str, amp: str | None = None) -> tuple[str, str, str]:
    """(lesson, code, fix) for an exception message."""
    for rule in RULES:
        if re.search(rule.pattern, message):
            lesson = rule.amp_lesson if (amp and rule.amp_lesson) else rule.lesson
            return lesson, rule.code, rule.fix
    return DEFAULT.lesson, DEFAULT.code, DEFAULT.fix
