"""The body each rank runs (through `ddp_lab.launch`): build the module, one watched forward and
backward pass without DDP, then DDP and `steps` training steps on rank-distinct data, measuring
what differs between ranks. Each phase writes its record to stdout as it ends (see sync.emit),
so a rank that fails or hangs later still reports what it saw."""
from __future__ import annotations

import gc

from .inputs import autocast, batch_for, call, default_loss, floating_tensors, move
from .randomness import seed_all, watch_global_generators, watch_randomness
from .regions import changed_state, module_state
from .sync import drift, emit, gather, new_group
from .trace import batchnorm_sizes, custom_functions, watch_forward
from .walk import graph_holders, state_tensors

SEED = 1000  # rank r builds its module after seeding torch, Python's random and NumPy with
# SEED + r: what DDP does not broadcast then differs between ranks from the start, as it does
# when ranks are seeded apart; and the doctor's own runs repeat from run to run


def probe(source, example, steps: int = 3, loss_fn=None, amp=None) -> dict:
    import torch

    from ..rankinfo import device, rank_info

    rank, dev = rank_info().rank, device()
    group = new_group()
    emit("phase", "build")
    seed_all(SEED + rank)  # torch, Python's random, NumPy: as a training script seeds each rank
    build_generators: list[str] = []
    with watch_global_generators(build_generators):
        model = source.build().to(dev)
    emit("build_generators", build_generators)
    batch = move(batch_for(example, rank), dev)
    lossf = loss_fn or default_loss
    emit("phase", "dry-run")
    dry = dry_run(model, batch, lossf, amp, dev)
    emit("dry", dry)
    emit("phase", "compare")
    everyone = gather(dry["unused"], group)
    unused = sorted(set().union(*everyone))
    if unused and all(u == everyone[0] for u in everyone):
        emit("phase", "unused")
        emit("unused_error", reproduce_unused_error(model, batch, lossf, amp, dev))
    emit("phase", "ddp")
    ddp = wrap(model, dev, find_unused=bool(unused))
    emit("drift_start", _drift_all(model, group))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    emit("phase", "steps")
    emit("steps", train(ddp, model, batch, lossf, amp, steps, dev))
    emit("drift_end", _drift_all(model, group))
    emit("unchanged", [n for n, p in model.named_parameters()
                       if n in before and p.requires_grad and torch.equal(p.detach(), before[n])])
    emit("phase", "done")
    return {"rank": rank}


def wrap(model, dev, find_unused: bool):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..rankinfo import ddp_kwargs

    return DDP(model, find_unused_parameters=find_unused, **ddp_kwargs(dev))


def _drift_all(model, group) -> dict:
    return {kind: drift(named, group) for kind, named in state_tensors(model).items()}


def dry_run(model, batch, lossf, amp, dev) -> dict:
    """One forward and backward pass of the bare module (no DDP), watched. If it raises, what
    was seen up to then is emitted before the exception goes on to the launcher."""
    ids = {n: id(p) for n, p in model.named_parameters()}
    record: dict = {"unused": [], "registered_in_forward": [], "nonfinite_grads": [],
                    "custom_functions": {}, "batchnorm": {}}
    try:
        with watch_forward(record, dev.type), batchnorm_sizes(model, record["batchnorm"]):
            with autocast(amp, dev.type):
                with watch_randomness(record, model):
                    out = call(model, batch)
                loss = lossf(out)
            record["custom_functions"] = custom_functions([loss, *floating_tensors(out)])
            state = module_state(model)
            loss.backward()
            record["changed_in_backward"] = changed_state(state, module_state(model))
    except BaseException:
        emit("dry", record)
        raise
    params = dict(model.named_parameters())
    record["registered_in_forward"] = sorted(n for n, p in params.items() if ids.get(n) != id(p))
    record["unused"] = sorted(n for n, p in params.items() if p.requires_grad and p.grad is None)
    record["nonfinite_grads"] = _nonfinite(params)
    record["graph_kept"] = graph_holders(model)
    model.zero_grad(set_to_none=True)
    if record["collectives"]:
        record["eval_collectives"] = eval_collectives(model, batch, amp, dev)
    return record


def eval_collectives(model, batch, amp, dev) -> list[str] | None:
    """The collectives one forward in eval mode calls (None if it raises): a forward that
    synchronises only in training lets one rank evaluate alone."""
    import torch

    from ..probes import record_collectives

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


def reproduce_unused_error(model, batch, lossf, amp, dev) -> str | None:
    """Two steps under a plain DDP (find_unused_parameters=False, as most training scripts
    have it): PyTorch's own error about the unused parameters, with their names
    (TORCH_DISTRIBUTED_DEBUG=INFO). Only when every rank has the same unused set, so that the
    buckets that never became ready are the same everywhere."""
    ddp = wrap(model, dev, find_unused=False)
    message = None
    try:
        for _ in range(2):
            with autocast(amp, dev.type):
                loss = lossf(call(ddp, batch))
            loss.backward()
    except RuntimeError as exc:
        message = f"{type(exc).__name__}: {exc}"
    model.zero_grad(set_to_none=True)
    del ddp
    gc.collect()
    return message


def train(ddp, model, batch, lossf, amp, steps: int, dev) -> dict:
    import torch

    from ..probes import record_collectives

    opt = torch.optim.Adam([p for p in ddp.parameters() if p.requires_grad], lr=1e-3)
    out: dict = {"collectives": [], "losses": [], "nonfinite_grads": []}
    for step in range(steps):
        emit("step", step)
        with record_collectives() as tl, autocast(amp, dev.type):
            loss = lossf(call(ddp, batch))
        out["collectives"].append([name for name, _, _ in tl.spans])
        loss.backward()
        bad = _nonfinite(dict(model.named_parameters()))
        out["nonfinite_grads"] = sorted(set(out["nonfinite_grads"]) | set(bad))
        out["losses"].append(float(loss.detach().float()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out
