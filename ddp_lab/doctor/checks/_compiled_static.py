"""The compiled check: a size that changes every step, compiled anew each time because the script
asked for static shapes (`torch.compile(..., dynamic=False)`).

By default dynamo compiles a frame for the sizes it first sees and, when a size guard fails,
recompiles once with that dimension dynamic (torch._dynamo.config.automatic_dynamic_shapes,
torch/_dynamo/config.py). `dynamic=False` turns that off (torch/_dynamo/eval_frame.py,
make_set_enable_dynamic: automatic_dynamic_shapes=False, assume_static_by_default=True): each new
size is a new graph until recompile_limit, then the frame runs eagerly. So when a size guard
fails step after step and the module was compiled with dynamic=False, the line at fault is that
compile call, not the call that passed the tensor."""
from __future__ import annotations


def static_sizes(ev, g: dict) -> tuple[str, str, str] | None:
    """For a recompile group whose guard is a size (`g["shape"]`): (the torch.compile line that
    set dynamic=False, an evidence line, the fix), or None."""
    if not g.get("shape"):
        return None
    line = next((s.get("line", "") for r in ev.ranks for s in r.get("compile-settings", [])
                 if s.get("dynamic") == "False" and s.get("line")), "")
    if not line:
        return None
    evidence = (f"dynamic=False at {line}: dynamo compiles every new size as a new graph instead "
                "of marking the size dynamic after its first change (automatic_dynamic_shapes off, "
                "torch/_dynamo/eval_frame.py make_set_enable_dynamic)")
    fix = ("drop dynamic=False (the default marks a size dynamic after it first changes), or pad "
           "each batch to one fixed size")
    return line, evidence, fix
