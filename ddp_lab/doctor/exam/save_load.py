"""The doctor's checkpoint round trip, under every strategy it runs: the module saved as users
save it, loaded into a fresh module (built from another seed, split or sharded the same way),
and compared value by value with what was saved.

- DDP (`torch_save_round_trip`, in this process): `torch.save` of the state dict, then
  `load_state_dict(torch.load(...))` into a fresh module.
- tensor parallel and FSDP2 (`dcp_round_trip`, on each rank of their launch):
  `torch.distributed.checkpoint.save` of `model.state_dict()`, then `dcp.load(sd)` into the
  fresh module's own `state_dict()`: DCP loads IN PLACE, into the tensors that state dict holds
  (torch/distributed/checkpoint/filesystem.py:914 copy_s into them in torch 2.13), so a tensor
  that is a copy of a parameter gets the values and the parameter does not. `model.load_state_dict(sd)` is then called as DCP's own
  docstring asks (state_dict_loader.py:94-96), and compared again.

What does not come back is a finding ("checkpoint-round-trip-lost") naming the tensors, by how
much, and why: a plain (non-DTensor) tensor whose value differs between ranks, which DCP's save
planner keeps from one rank only (_dedup_save_plans.py:42-55: every rank writes the same
MetadataIndex(fqn, offsets 0), planner_helpers.py:208-209, and one plan keeps it); a
state-dict hook returning copies; a tensor outside the state dict (a non-persistent buffer).
"""
from __future__ import annotations

from ..batch import call, floating_tensors
from ..checks import judge
from ..checks.api import Evidence
from ..checks.roundtrip import TOLERANCE
from .inputs import batch_for, default_loss

SEED_SAVED, SEED_FRESH = 0, 12345


def local(t):
    t = t.detach()
    return (t.to_local() if hasattr(t, "to_local") else t).clone()


def snapshot(model) -> dict:
    """name -> this rank's local values of every parameter and buffer (tied names included)."""
    out = {n: local(p) for n, p in model.named_parameters(remove_duplicate=False)}
    out.update({n: local(b) for n, b in model.named_buffers(remove_duplicate=False)})
    return out


def differences(saved: dict, now: dict) -> dict:
    """name -> max |saved - now| for tensors of the same shape that differ."""
    out = {}
    for name, a in saved.items():
        b = now.get(name)
        if b is None or b.shape != a.shape or not a.is_floating_point():
            continue
        d = float((a - b).abs().max()) if a.numel() else 0.0
        if d > TOLERANCE:
            out[name] = d
    return out


def plain_differing(model) -> list[str]:
    """Plain tensors (not DTensors) in the state dict whose values differ between ranks."""
    import torch
    import torch.distributed as dist

    sd = model.state_dict()
    names = [n for n, t in sd.items() if isinstance(t, torch.Tensor) and not hasattr(t, "to_local")]
    sums = torch.tensor([float(sd[n].double().sum()) if sd[n].is_floating_point() else 0.0
                         for n in names] + [0.0], dtype=torch.float64)
    every = [torch.zeros_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(every, sums)
    return [n for i, n in enumerate(names) if any(abs(float(e[i] - every[0][i])) > TOLERANCE
                                                    for e in every)]


def eval_output(model, batch):
    import torch

    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            outs = [local(t) for t in floating_tensors(call(model, batch))]
    finally:
        model.train(was)
    return outs


def output_difference(a: list, b: list) -> float:
    return max((float((x - y).abs().max()) for x, y in zip(a, b) if x.shape == y.shape),
               default=0.0)


def dcp_round_trip(saved, build_fresh, batch, folder: str) -> dict:
    """On each rank: `saved` (split or sharded, trained) saved with DCP into `folder`, a fresh
    module from `build_fresh()` (split or sharded the same way) loaded in place, then with
    load_state_dict; plain data of what did not come back."""
    import torch.distributed.checkpoint as dcp

    before, differing = snapshot(saved), plain_differing(saved)
    keys = set(saved.state_dict())
    dcp.save(saved.state_dict(), checkpoint_id=folder)
    out_before = eval_output(saved, batch)  # after saving: a forward may change state (a counter)
    fresh = build_fresh()
    sd = fresh.state_dict()
    dcp.load(sd, checkpoint_id=folder)
    in_place = differences(before, snapshot(fresh))
    error = ""
    try:
        fresh.load_state_dict(sd)
    except Exception as exc:  # PyTorch's own message is the evidence
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    lost = differences(before, snapshot(fresh))
    return {"how": "dcp", "lost": lost, "in_place_only": {k: v for k, v in in_place.items()
                                                          if k not in lost},
            "plain_differing": differing, "outside": sorted(set(before) - keys),
            "output": output_difference(out_before, eval_output(fresh, batch)),
            "load_error": error}


def fsdp2_round_trip(source, batch, folder: str) -> dict:
    """On each rank under FSDP2: the module built from one seed on every rank (as users seed),
    sharded as sharded.py plans its units, one SGD step, then `dcp_round_trip`."""
    import torch
    from torch.distributed.fsdp import fully_shard

    def build(seed):
        torch.manual_seed(seed)
        model = source.build()
        # sharded.plan's units (every direct child with parameters, then the root), written out
        # here: sharded.py calls this module, and the layers allow no import back (test_layers)
        for unit in [c for c in model.children() if any(True for _ in c.parameters())] + [model]:
            fully_shard(unit)
        return model

    saved = build(SEED_SAVED)
    default_loss(call(saved, batch)).backward()
    torch.optim.SGD(saved.parameters(), lr=0.1).step()
    return dcp_round_trip(saved, lambda: build(SEED_FRESH), batch, folder)


def torch_save_round_trip(source, example) -> dict:
    """`_torch_save_round_trip` with this process's random state kept as it was (it seeds), the
    module's prints and PyTorch's warnings kept out of the report (the ranks report warnings)."""
    import contextlib
    import io
    import warnings

    import torch

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return _torch_save_round_trip(source, example)


def _torch_save_round_trip(source, example) -> dict:
    """In this process, as a DDP user saves (rank 0's `torch.save(model.state_dict())`) and
    resumes (`load_state_dict(torch.load(...))`): one step taken first, so state that training
    changes (running statistics, counters) has moved from its initial value."""
    import io

    import torch

    batch = batch_for(example, 0)
    torch.manual_seed(SEED_SAVED)
    saved = source.build()
    default_loss(call(saved, batch)).backward()
    torch.optim.SGD(saved.parameters(), lr=0.1).step()
    before, keys = snapshot(saved), set(saved.state_dict())
    buf = io.BytesIO()
    torch.save(saved.state_dict(), buf)
    buf.seek(0)
    out_before = eval_output(saved, batch)  # after saving: a forward may change state (a counter)
    torch.manual_seed(SEED_FRESH)
    fresh = source.build()
    error = ""
    try:
        fresh.load_state_dict(torch.load(buf, weights_only=False))
    except Exception as exc:  # PyTorch's own message is the evidence
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return {"how": "torch.save", "lost": differences(before, snapshot(fresh)), "in_place_only": {},
            "plain_differing": [], "outside": sorted(set(before) - keys),
            "output": output_difference(out_before, eval_output(fresh, batch)),
            "load_error": error}


def phase(subject):
    """(None, findings of the registry's roundtrip check): under DDP, the round trip in this
    process, as a DDP user saves (`torch_save_round_trip`); no launch."""
    try:
        record = {"round_trip": torch_save_round_trip(subject.source, subject.example)}
    except Exception as exc:  # e.g. a forward that needs a process group: the check says so
        record = {"round_trip_error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return None, judge("roundtrip", Evidence([record], subject=subject))
