"""Randomness across ranks (lesson 14): the doctor seeds every generator a module may draw from
(torch, Python's `random`, NumPy's global generator) with `seed + rank`, watches the random
numbers forward draws, and reports

- random draws in forward (dropout masks, torch.rand...) that are identical on every rank although
  each rank was seeded differently: the module seeds a generator of its own with a constant;
- Python's `random` or NumPy's global generator used in forward or while the module is built:
  state torch.manual_seed does not seed and DDP never broadcasts.

Everything a rank records is plain data (see dynamic.py); `random_findings` reads it."""
from __future__ import annotations

import hashlib
import random
import sys
from contextlib import contextmanager

from ..frames import user_frame
from ..report import Finding
from .static import names

# torch functions and Tensor methods whose result is a random draw
DRAWS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm",
         "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "multinomial", "poisson",
         "exponential_", "random_", "geometric_", "cauchy_", "log_normal_"}
# functions whose random part is the mask: the elements they zeroed
DROPOUTS = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
            "feature_alpha_dropout", "feature_dropout"}
MAX_DRAWS = 64
GENERATORS = {"random": "Python's global `random`", "numpy": "NumPy's global generator"}


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def seed_all(seed: int) -> None:
    """Seed torch, Python's `random` and NumPy's global generator, as a training script should
    seed each rank's data and dropout."""
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed % 2**32)


def fingerprint(t) -> str | None:
    """A digest of a random draw's values; None for a draw with nothing random in it (empty, or
    one value everywhere: a dropout that dropped nothing)."""
    import torch

    t = t.detach()
    if t.numel() == 0 or bool((t == t.reshape(-1)[0]).all()):
        return None
    t = t.cpu().contiguous()
    data = t.to(torch.uint8) if t.dtype == torch.bool else t
    return hashlib.blake2b(data.numpy().tobytes(), digest_size=8).hexdigest()


def _global_functions():
    """(label, module, {name: bound method}) for each global generator: the module-level
    functions of `random` and `numpy.random` are bound methods of one hidden instance."""
    out = [("random", random, random._inst)]
    np = sys.modules.get("numpy")
    if np is not None:
        out.append(("numpy", np.random, np.random.mtrand._rand))
    for label, module, instance in out:
        funcs = {n: f for n in dir(module) if not n.startswith("_")
                 and n not in ("seed", "getstate", "setstate", "get_state", "set_state")
                 and getattr(f := getattr(module, n), "__self__", None) is instance}
        yield label, module, funcs


def _state(label: str):
    if label == "random":
        return random.getstate()
    state = sys.modules["numpy"].random.get_state()
    return state[1].tobytes(), state[2]


def _recording(label: str, module_name: str, name: str, func, found: list[str]):
    def call(*args, **kwargs):
        where = user_frame(sys._getframe(1), skip=("/random.py", "/numpy/"))
        entry = f"{label}: {module_name}.{name}() at {where}"
        if where and entry not in found:
            found.append(entry)
        return func(*args, **kwargs)
    return call


@contextmanager
def watch_global_generators(found: list[str]):
    """Inside the block, append to `found` each use of Python's global `random` or NumPy's global
    generator: "random: random.sample() at Net.__init__ (net.py:12): ...". A draw through a name
    imported before (`from random import choice`) is found by the generator's state changing."""
    patched, before = [], {}
    for label, module, funcs in _global_functions():
        before[label] = _state(label)
        for name, func in funcs.items():
            setattr(module, name, _recording(label, module.__name__, name, func, found))
            patched.append((module, name, func))
    try:
        yield
    finally:
        for module, name, func in patched:
            setattr(module, name, func)
        for label, state in before.items():
            if _state(label) != state and not any(f.startswith(label + ":") for f in found):
                found.append(f"{label}: {GENERATORS[label]} (drawn from outside any call it saw)")


def _draw_mode(draws: list[dict], inside: list[str]):
    import torch
    from torch.overrides import TorchFunctionMode

    class RandomDraws(TorchFunctionMode):
        """Records a fingerprint of every random draw forward makes through torch."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if len(draws) < MAX_DRAWS and name in DRAWS | DROPOUTS:
                drawn = out
                if name in DROPOUTS and args and isinstance(args[0], torch.Tensor):
                    drawn = (args[0] != 0) & (out == 0)
                if isinstance(drawn, torch.Tensor):
                    frame = user_frame()
                    module = f"module {inside[-1]!r}" if inside else "forward"
                    where = f"{module}, {frame}" if frame else module
                    draws.append({"op": name, "where": where, "fp": fingerprint(drawn)})
            return out

    return RandomDraws()


@contextmanager
def _module_stack(model, inside: list[str]):
    """Inside the block, `inside[-1]` names the sub-module whose forward is running."""
    def enter(label):
        def pre(module, args) -> None:
            inside.append(label)
        return pre

    def leave(module, args, out) -> None:  # returns None: a forward hook's result replaces out
        if inside:
            inside.pop()

    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name or type(module).__name__)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def watch_randomness(record: dict, model):
    """Inside the block (one forward of `model`), record into `record`: "random_draws" (op,
    where, fingerprint of each random draw through torch) and "global_generators" (uses of
    Python's or NumPy's global generator)."""
    draws: list[dict] = []
    used: list[str] = []
    inside: list[str] = []
    try:
        with _module_stack(model, inside), _draw_mode(draws, inside), watch_global_generators(used):
            yield
    finally:
        record["random_draws"] = draws
        record["global_generators"] = used


def random_findings(recs: list[dict]) -> list[Finding]:
    """Findings from every rank's records: "dry" (see watch_randomness) and "build_generators"
    (global generators used while the module was built)."""
    drys = [r.get("dry") or {} for r in recs]
    out = _identical_draws([d.get("random_draws") for d in drys])
    out += _globals("forward", sorted({u for d in drys for u in d.get("global_generators", [])}))
    out += _globals("build", sorted({u for r in recs for u in r.get("build_generators") or []}))
    return out


def _identical_draws(per_rank: list) -> list[Finding]:
    if len(per_rank) < 2 or any(d is None for d in per_rank):
        return []
    same = [column[0] for column in zip(*per_rank)
            if column[0]["fp"] and len({c["fp"] for c in column}) == 1
            and len({c["op"] for c in column}) == 1]
    if not same:
        return []
    where = sorted({f"{d['op']} at {d['where']}" for d in same})
    return [Finding(
        "warning", "random-draws-identical-across-ranks", "14",
        f"{len(same)} random draw(s) in forward are identical on every rank",
        [f"{names(where, 4)}", f"{len(same)} of {min(map(len, per_rank))} random draws in one "
         "forward were the same on all ranks, although the doctor seeded each rank's generators "
         "with a different seed",
         "every rank drops the same units (or adds the same noise): the averaged gradient is "
         "world_size copies of one rank's randomness"],
        "draw from torch's default generator, seeded with base_seed + rank after the model is "
        "built; a generator the module owns must be seeded with the rank too")]


def _globals(when: str, used: list[str]) -> list[Finding]:
    if not used:
        return []
    kinds = sorted({u.split(":", 1)[0] for u in used})
    label = " and ".join(GENERATORS[k] for k in kinds)
    calls = [u.split(": ", 1)[1] for u in used]
    if when == "forward":
        return [Finding(
            "warning", "global-generator-in-forward", "14", f"forward draws from {label}",
            calls[:6] + ["torch.manual_seed does not seed it, checkpointing does not replay it, "
                         "and in DataLoader workers or ranks seeded alike it repeats"],
            "draw random numbers with torch (torch.rand(..., device=x.device)); if you need "
            "Python or NumPy, own a generator seeded with (seed, rank)")]
    return [Finding(
        "warning", "global-generator-in-init", "14", f"the module draws from {label} while it is built",
        calls[:6] + ["what it draws is not a parameter or buffer: DDP never broadcasts it, so ranks "
                     "seeded differently build different modules"],
        "seed Python's random and NumPy alike on every rank before building the model (by rank "
        "only afterwards), or give the module a generator of its own with a fixed seed")]
