"""Checkpointed regions, watched: which `torch.utils.checkpoint` calls run (reentrant or not),
whether a region draws random numbers while `preserve_rng_state=False`, and what module state
changes during backward (a recomputed region repeating its side effects).

The reentrant path is seen through `CheckpointFunction.apply`, the non-reentrant one through
the generator `checkpoint` runs: `_checkpoint_without_reentrant_generator` up to torch 2.13,
`_checkpoint_without_reentrant_generator_impl` (arguments as a tuple and a dict) from 2.14, where
the old name is a shim that calls it. Each is looked up by torch at call time, so user code that
imported `checkpoint` by name is seen too. Where a torch version lacks them, that part is
silently not watched (tests/doctor/test_doctor_gradients.py fails then)."""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

from ...instruments.modwalk import base_attrs, is_torch_class


def _rng_state(dev_type: str):
    import torch

    if dev_type == "cuda":
        return torch.cuda.get_rng_state()
    return torch.get_rng_state()


def _changed(before, dev_type: str) -> bool:
    import torch

    return not torch.equal(before, _rng_state(dev_type))


@contextmanager
def _patch(owner, name: str, make):
    """Replace `owner.name` by `make(original)` inside the block (nothing if it is missing)."""
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    own = owner.__dict__.get(name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        if own is None:
            delattr(owner, name)
        else:
            setattr(owner, name, own)


def _reentrant(calls: list[dict], where, dev_type):
    def make(original):  # original: CheckpointFunction.apply, bound to the class
        def apply(cls, function, preserve, *args):
            entry = {"reentrant": True, "preserve_rng": bool(preserve), "rng_used": False,
                     "where": where()}
            calls.append(entry)

            def run(*a, **k):
                before = _rng_state(dev_type)
                try:
                    return function(*a, **k)
                finally:
                    entry["rng_used"] |= _changed(before, dev_type)

            return original(run, preserve, *args)

        return classmethod(apply)
    return make


def _non_reentrant(calls: list[dict], where, dev_type):
    def make(original):
        def generator(fn, preserve_rng_state=True, *args, **kwargs):
            entry = {"reentrant": False, "preserve_rng": bool(preserve_rng_state),
                     "rng_used": False, "where": where()}
            calls.append(entry)
            before = _rng_state(dev_type)
            yield from original(fn, preserve_rng_state, *args, **kwargs)
            entry["rng_used"] = _changed(before, dev_type)  # after the region's forward

        return generator
    return make


def _non_reentrant_impl(calls: list[dict], where, dev_type):
    """torch 2.14's `_checkpoint_without_reentrant_generator_impl(fn, args, kwargs, *, ...)`."""
    def make(original):
        def generator(fn, args, kwargs, *, preserve_rng_state=True, **options):
            entry = {"reentrant": False, "preserve_rng": bool(preserve_rng_state),
                     "rng_used": False, "where": where()}
            calls.append(entry)
            before = _rng_state(dev_type)
            yield from original(fn, args, kwargs, preserve_rng_state=preserve_rng_state,
                                **options)
            entry["rng_used"] = _changed(before, dev_type)  # after the region's forward

        return generator
    return make


@contextmanager
def watch_checkpoints(calls: list[dict], where, dev_type: str = "cpu"):
    """Inside the block, every checkpointed region appends {"reentrant", "preserve_rng",
    "rng_used", "where"} to `calls`; `where()` names the caller."""
    from torch.utils import checkpoint

    # The innermost generator only: on 2.14 the old name calls the new one (recorded once).
    impl = "_checkpoint_without_reentrant_generator_impl"
    non_reentrant = ((impl, _non_reentrant_impl) if hasattr(checkpoint, impl)
                     else ("_checkpoint_without_reentrant_generator", _non_reentrant))
    with ExitStack() as stack:
        stack.enter_context(_patch(checkpoint.CheckpointFunction, "apply",
                                   _reentrant(calls, where, dev_type)))
        stack.enter_context(_patch(checkpoint, non_reentrant[0],
                                   non_reentrant[1](calls, where, dev_type)))
        yield


def _fingerprint(value):
    import torch

    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value._version, value.data_ptr())
    if isinstance(value, (list, tuple, dict, set)):
        return (type(value).__name__, len(value))
    return None  # other objects: not compared


def module_state(model) -> dict:
    """A cheap fingerprint of what a module keeps between calls: its own (non-torch) modules'
    plain attributes, and every buffer's version counter."""
    base, out = base_attrs(), {}
    for mod_name, m in model.named_modules():
        prefix = f"{mod_name}." if mod_name else ""
        for name, buf in m.named_buffers(recurse=False):
            out[prefix + name] = ("tensor", tuple(buf.shape), buf._version, buf.data_ptr())
        if is_torch_class(m):
            continue
        for attr, value in vars(m).items():
            if attr not in base and (fp := _fingerprint(value)) is not None:
                out[prefix + attr] = fp
    return out


def describe_change(before, after) -> str:
    if isinstance(before, tuple) and before[0] == "tensor":
        return "updated in place" if before[3] == after[3] else "replaced"
    if isinstance(before, tuple):
        return f"length {before[1]} -> {after[1]}"
    return f"{before!r} -> {after!r}"


def changed_state(before: dict, after: dict) -> list[str]:
    return [f"{n}: {describe_change(before[n], after[n])}" for n in before
            if n in after and before[n] != after[n]]
