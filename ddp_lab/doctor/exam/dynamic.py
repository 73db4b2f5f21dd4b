"""The body each rank runs (through `ddp_lab.launch`): build the module, one watched forward and
backward pass without DDP, then DDP and `steps` training steps on rank-distinct data, measuring
what differs between ranks. Each phase writes its record to stdout as it ends (see sync.emit),
so a rank that fails or hangs later still reports what it saw."""
from __future__ import annotations

import gc

from ...instruments.modwalk import graph_holders, state_tensors
from ...instruments.probes import gather, named_drift, record_collectives
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from ..batch import call, floating_tensors, move
from ..sync import emit, new_group
from .inputs import autocast
from .randomness import seed_all, watch_global_generators, watch_randomness
from .regions import changed_state, module_state
from .shapes import rank_batch
from .trace import batchnorm_sizes, custom_functions, watch_forward

SEED = 1000  # rank r builds its module after seeding torch, Python's random and NumPy with
# SEED + r: what DDP does not broadcast then differs between ranks from the start, as it does
# when ranks are seeded apart; and the doctor's own runs repeat from run to run


def probe(subject) -> dict:
    """One rank of the DDP phase (ddp.py). The dry run watches one instance; DDP then wraps a
    FRESH instance built the same way, so that nothing the dry run did (a first-batch
    initialisation, a lazily built cache) hides what the module does under DDP."""
    import torch

    source, example, steps, loss, amp = (subject.source, subject.example, subject.steps,
                                         subject.loss, subject.amp)
    rank, dev = rank_info().rank, device()
    user = dict(subject.ddp_kwargs or {})
    group = new_group()
    emit("phase", "build")
    model = _build(source, rank, dev)
    batch = move(rank_batch(example, rank, subject.plan), dev)
    emit("phase", "dry-run")
    dry = dry_run(model, batch, loss, amp, dev)
    emit("dry", dry)
    emit("phase", "compare")
    everyone = gather(dry["unused"], group)
    unused = sorted(set().union(*everyone))
    if unused and all(u == everyone[0] for u in everyone) and not _handles_unused(user):
        emit("phase", "unused")
        emit("unused_error", reproduce_unused_error(model, batch, loss, amp, dev, user))
    del model
    gc.collect()
    emit("phase", "ddp")
    model = _build(source, rank, dev)
    emit("structure", {n: [list(p.shape), p.requires_grad] for n, p in model.named_parameters()})
    ddp = wrap(model, dev, {**user, "find_unused_parameters":
                            bool(user.get("find_unused_parameters")) or bool(unused)})
    emit("drift_start", _drift_all(model, group))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    emit("phase", "steps")
    emit("steps", train(ddp, model, batch, loss, amp, steps, dev))
    emit("drift_end", _drift_all(model, group))
    emit("shapes", _shapes(model))
    emit("unchanged", [n for n, p in model.named_parameters()
                       if n in before and p.requires_grad and torch.equal(p.detach(), before[n])])
    emit("phase", "done")
    return {"rank": rank}


def _build(source, rank: int, dev):
    seed_all(SEED + rank)  # torch, Python's random, NumPy: as a training script seeds each rank
    used: list[str] = []
    with watch_global_generators(used):
        model = source.build().to(dev)
    emit("build_generators", used)
    return model


def _handles_unused(user: dict) -> bool:
    return bool(user.get("find_unused_parameters") or user.get("static_graph"))


def _shapes(model) -> dict:
    """{kind: {name: shape}} of the state that may follow the input: buffers and plain tensors."""
    tables = state_tensors(model)
    return {k: {n: list(t.shape) for n, t in tables[k].items()}
            for k in ("buffer", "unregistered_state")}


def wrap(model, dev, settings: dict):
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, **{**settings, **ddp_kwargs(dev)})


def _drift_all(model, group) -> dict:
    return {kind: named_drift(named, group) for kind, named in state_tensors(model).items()}


def dry_run(model, batch, loss, amp, dev) -> dict:
    """One forward and backward pass of the bare module (no DDP), watched; the user's loss is
    computed outside the watch (its random numbers and factories are not forward's). If it
    raises, what was seen up to then is emitted before the exception goes on to the launcher."""
    ids = {n: id(p) for n, p in model.named_parameters()}
    record: dict = {"unused": [], "registered_in_forward": [], "nonfinite_grads": [],
                    "custom_functions": {}, "batchnorm": {}}
    try:
        marks = _marks(model)
        with watch_forward(record, dev.type), batchnorm_sizes(model, record["batchnorm"]):
            with autocast(amp, dev.type):
                with watch_randomness(record, model):
                    out = call(model, batch)
        record["set_in_forward"] = _written(model, marks)
        with autocast(amp, dev.type):
            total = loss(out, batch)
        record["custom_functions"] = custom_functions([total, *floating_tensors(out)])
        state, marks, later = module_state(model), _marks(model), {}
        with watch_forward(later, dev.type):
            total.backward()
        _merge(record, later)
        record["changed_in_backward"] = changed_state(state, module_state(model))
        record["set_in_backward"] = _written(model, marks)
    except BaseException:
        emit("dry", record)
        raise
    params = dict(model.named_parameters())
    record["registered_in_forward"] = sorted(n for n, p in params.items() if ids.get(n) != id(p))
    hooked = {n for n, p in params.items() if getattr(p, "_post_accumulate_grad_hooks", None)}
    no_grad = {n for n, p in params.items() if p.requires_grad and p.grad is None}
    record["hooked"] = sorted(hooked)
    record["consumed"] = sorted(no_grad & hooked)
    record["unused"] = sorted(no_grad - hooked)
    record["nonfinite_grads"] = _nonfinite(params)
    record["graph_kept"] = graph_holders(model)
    record["shapes"] = _shapes(model)
    model.zero_grad(set_to_none=True)
    if record["collectives"]:
        record["eval_collectives"] = eval_collectives(model, batch, amp, dev)
    return record


def _merge(record: dict, later: dict) -> None:
    """What backward did (a recomputed region, a collective in a custom backward) joins what
    forward did; the loss in between is the user's and is not watched."""
    for key, value in later.items():
        if isinstance(value, list):
            record[key] = record.get(key, []) + [v for v in value if v not in record.get(key, [])]


def _marks(model) -> dict:
    """{name: (version counter, sum)} of every parameter: an in-place write changes one."""
    import torch

    with torch.no_grad():
        return {n: (p._version, float(p.detach().float().sum())) for n, p in model.named_parameters()}


def _written(model, marks: dict) -> list[str]:
    """The parameters written to since `marks` (NaN sums compare equal)."""
    now = _marks(model)
    return sorted(n for n, (v, s) in marks.items() if n in now and (
        now[n][0] != v or (now[n][1] != s and not (s != s and now[n][1] != now[n][1]))))


def eval_collectives(model, batch, amp, dev) -> list[str] | None:
    """The collectives one forward in eval mode calls (None if it raises): a forward that
    synchronises only in training lets one rank evaluate alone."""
    import torch

    model.eval()
    try:
        with torch.no_grad(), record_collectives() as tl, autocast(amp, dev.type):
            call(model, batch)
    except Exception:
        return None
    finally:
        model.train()
    return [name for name, _, _ in tl.spans]


def _nonfinite(params: dict) -> list[str]:
    import torch

    return sorted(n for n, p in params.items()
                  if p.grad is not None and not bool(torch.isfinite(p.grad).all()))


def reproduce_unused_error(model, batch, loss, amp, dev, user: dict) -> str | None:
    """Two steps under a plain DDP (find_unused_parameters=False, as most training scripts
    have it): PyTorch's own error about the unused parameters, with their names
    (TORCH_DISTRIBUTED_DEBUG=INFO). Only when every rank has the same unused set, so that the
    buckets that never became ready are the same everywhere."""
    ddp = wrap(model, dev, {**user, "find_unused_parameters": False})
    message = None
    try:
        for _ in range(2):
            with autocast(amp, dev.type):
                total = loss(call(ddp, batch), batch)
            total.backward()
    except RuntimeError as exc:
        message = f"{type(exc).__name__}: {exc}"
    model.zero_grad(set_to_none=True)
    del ddp
    gc.collect()
    return message


def train(ddp, model, batch, loss, amp, steps: int, dev) -> dict:
    import torch

    opt = torch.optim.Adam([p for p in ddp.parameters() if p.requires_grad], lr=1e-3)
    out: dict = {"collectives": [], "losses": [], "nonfinite_grads": []}
    for step in range(steps):
        emit("step", step)
        with record_collectives() as tl, autocast(amp, dev.type):
            output = call(ddp, batch)
        out["collectives"].append([name for name, _, _ in tl.spans])
        with autocast(amp, dev.type):
            total = loss(output, batch)
        total.backward()
        bad = _nonfinite(dict(model.named_parameters()))
        out["nonfinite_grads"] = sorted(set(out["nonfinite_grads"]) | set(bad))
        out["losses"].append(float(total.detach().float()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out
