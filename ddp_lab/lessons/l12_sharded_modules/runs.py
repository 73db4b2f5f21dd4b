"""What runs on each rank in lesson 12's FSDP2 scenarios: a few training steps of a module
sharded with `fully_shard`, one unit per child with parameters (see `modules.units`).

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import copy

import torch

from ...launching.rankinfo import rank_info
from .modules import Scaled, TiedLM, adapted, features, mlp, scaled_net, tokens, units


def shard(model, plan=units):
    """`fully_shard` every unit of `plan(model)`, innermost first; the root last."""
    from torch.distributed.fsdp import fully_shard

    for unit in plan(model):
        fully_shard(unit)
    return model


def train_tied(model_cls=TiedLM, steps: int = 2) -> dict:
    """A few steps of a tied language model, sharded per child."""
    rank = rank_info().rank
    torch.manual_seed(0)
    model = shard(model_cls())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(
            model(tokens(rank)).flatten(0, 1), tokens(rank + 10).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses}


def norm_of_shard(weight) -> float:
    """What a logging line does: read the weight, take its norm."""
    return float(weight.norm())


def norm_of_full(weight) -> float:
    """A fix: gather the whole weight first (a collective: every rank must call it)."""
    return float(weight.full_tensor().norm())


def norm_reduced(weight) -> float:
    """The cheap fix: each rank takes its shard's part of the norm (a DTensor with a partial
    placement) and `full_tensor()` reduces that one number across the ranks (a collective:
    every rank must call it)."""
    return float(weight.norm().full_tensor())


def log_weight_norm(read=norm_of_shard, steps: int = 2) -> dict:
    """Train a sharded MLP and log the last layer's weight norm between steps, beside the
    truth from an unsharded copy that takes the same steps."""
    rank = rank_info().rank
    torch.manual_seed(0)
    ref = mlp()
    model = shard(copy.deepcopy(ref))
    weight = model[4].weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    logged, truth = [], []
    for _ in range(steps):
        model(features(rank)).pow(2).mean().backward()
        both = torch.cat([features(0), features(1)])  # the global batch: FSDP2 averages grads
        ref(both).pow(2).mean().backward()
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
        logged.append(read(weight))
        truth.append(float(ref[4].weight.norm()))
    error = max(abs(a - b) / b for a, b in zip(logged, truth))
    return {"logged": logged, "truth": truth, "norm_error": error,
            "what_was_read": f"{type(weight).__name__} of shape {tuple(weight.shape)}, "
                             f"local shard {tuple(weight.to_local().shape)}"}


def state_dict_as_is(model) -> dict:
    """What a DDP habit does: take `model.state_dict()` (it holds DTensor shards)."""
    return model.state_dict()


def full_state_dict(model) -> dict:
    """The fix: gather full tensors onto the CPU with torch.distributed.checkpoint's helper."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


def save_and_reload(take=state_dict_as_is, steps: int = 2) -> dict:
    """Train sharded, take a state dict, load it into a plain module on every rank that
    received one, compare it with an unsharded model trained on the same global batches."""
    rank = rank_info().rank
    torch.manual_seed(0)
    ref, plain = mlp(), mlp()
    model = shard(copy.deepcopy(ref))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(steps):
        model(features(rank)).pow(2).mean().backward()
        ref(torch.cat([features(0), features(1)])).pow(2).mean().backward()
        for o in (opt, ref_opt):
            o.step()
            o.zero_grad()
    state = take(model)
    kinds = sorted({type(v).__name__ for v in state.values()})
    if not state:  # with cpu_offload=True only rank 0 receives the full state
        return {"value_types": kinds, "keys": 0, "max_diff": None}
    plain.load_state_dict(state)
    diff = max(float((a - b).abs().max()) for a, b in zip(plain.state_dict().values(),
                                                           ref.state_dict().values()))
    return {"value_types": kinds, "keys": len(state), "max_diff": diff}


def count_collectives(unit) -> dict:
    """Count the bytes FSDP2 all-gathers and reduce-scatters for `unit` (this rank's shard),
    through FSDP2's own hooks for custom collectives; the collectives themselves are FSDP2's."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                       DefaultReduceScatter)
    sent = {"gathered": 0, "reduced": 0}

    class Gather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            sent["gathered"] += input_tensor.numel() * input_tensor.element_size()
            return super().__call__(output_tensor, input_tensor, group, async_op)

    class Reduce(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            sent["reduced"] += output_tensor.numel() * output_tensor.element_size()
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    unit.set_custom_all_gather(Gather())
    unit.set_custom_reduce_scatter(Reduce())
    return sent


def freeze_base(model) -> None:
    """The fix: mark the frozen part frozen, inside the same unit as the trainable adapter."""
    model[1].base.requires_grad_(False)


def train_adapted(freeze=None, steps: int = 2) -> dict:
    """Fine-tune the adapter of a block whose `base` stays fixed; the optimizer gets every
    parameter but the base's. Bytes FSDP2 moves for the block's unit, per step, on this rank."""
    rank = rank_info().rank
    torch.manual_seed(0)
    model = adapted()
    if freeze is not None:
        freeze(model)
    block = model[1]
    before = block.base.weight.detach().clone()
    shard(model)
    sent = count_collectives(block)
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if ".base." not in n], lr=0.1)
    for _ in range(steps):
        model(features(rank)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    adapter = sum(p.to_local().numel() * 4 for p in (block.down.weight, block.up.weight))
    grad = block.base.weight.grad
    return {"gathered_per_step": sent["gathered"] // steps,
            "reduced_per_step": sent["reduced"] // steps, "adapter_shard_bytes": adapter,
            "frozen_reduced_bytes": sent["reduced"] // steps - adapter,
            "frozen_grad_held": None if grad is None else grad.to_local().numel() * 4,
            "base_moved": float((block.base.weight.full_tensor() - before).abs().max())}


def mixed_precision(model_cls=Scaled) -> dict:
    """A forward and backward of a model whose block is `model_cls`, sharded per block under
    MixedPrecisionPolicy(param_dtype=bfloat16), beside the same model unsharded in float32:
    the dtypes met inside the block."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank = rank_info().rank
    torch.manual_seed(0)
    model = scaled_net(model_cls)
    ref = copy.deepcopy(model)
    for unit in units(model):
        fully_shard(unit, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    block, seen = model[0], {}

    def note(name):
        def hook(module, args, out=None):
            seen.setdefault(name, (args[0] if out is None else out).dtype)
        return hook
    block.lin.register_forward_hook(note("lin output"))
    block.out.register_forward_pre_hook(note("out input"))
    x = features(rank)
    y = model(x)
    y.pow(2).mean().backward()
    want = ref(x)
    return {"dtypes": {k: str(v).replace("torch.", "") for k, v in
                       {**seen, "scale (buffer)": block.scale.dtype,
                        "shift (plain tensor)": block.shift.dtype, "output": y.dtype}.items()},
            "rel_error": float((y.float() - want).norm() / want.norm())}
