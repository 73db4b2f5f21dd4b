"""What runs on each rank in lesson 12's DeepSpeed ZeRO-3 scenarios. DeepSpeed is imported
inside these functions only, so lessons that never use it do not pay for its import.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import contextlib

import torch

from ...launching.rankinfo import rank_info, restart_clock
from .modules import features, mlp

# torch.optim.Adam is in DeepSpeed 0.19.8's ZERO_SUPPORTED_OPTIMIZERS (runtime/zero/utils.py:45-48):
# no "zero_allow_untested_optimizer" needed (an optimizer outside that list, SGD, would need it).
CONFIG = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3}}


def deepspeed_ready():
    """DeepSpeed imported and its communication set up on the launcher's group (gloo on CPU,
    NCCL on GPUs). DeepSpeed's accelerator comes from `DS_ACCELERATOR` or its own detection
    (deepspeed/accelerator/real_accelerator.py:59-60, 214), CPU here. On CPU, refuses to start if
    DeepSpeed's C++ op is not built yet, rather than compile it for minutes inside this rank
    (`ddp-lab build-ops`)."""
    if not torch.cuda.is_available():
        from ...instruments.deepspeed_ops import require_built
        require_built()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
    return deepspeed


def zero3_engine(model, stage: int = 3):
    """`deepspeed.initialize` of `model` with a torch Adam at ZeRO `stage`."""
    deepspeed = deepspeed_ready()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # DeepSpeed keeps parameters smaller than stage3_param_persistence_threshold (default
    # 100,000 elements) whole after their first forward; 0 makes this small model behave like
    # a large one, whose weights are partitioned again after every forward.
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0} if stage == 3 else {"stage": stage}
    config = {**CONFIG, "zero_optimization": zero}
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    restart_clock()  # the launch's timeout counts from here, not from the seconds of set-up
    return engine


def squares(params) -> float:
    """A weight penalty, computed in the training loop: the sum of every squared weight."""
    return float(sum(p.detach().pow(2).sum() for p in params))


def read_as_is(params):
    return contextlib.nullcontext()


def read_gathered(params):
    """The fix: gather the partitioned parameters for the block (read-only: no
    modifier_rank, so nothing is written back)."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(params)


def zero3_penalty(gather=read_as_is, steps: int = 2) -> dict:
    """Train under ZeRO-3 and compute a weight penalty before and between steps, beside the
    truth: the same penalty of the gathered weights."""
    import deepspeed

    rank = rank_info().rank
    torch.manual_seed(0)
    model = mlp()
    engine = zero3_engine(model)
    params = list(model.parameters())
    read, truth, shapes = [], [], set()
    for step in range(steps + 1):
        if step:
            engine.backward(engine(features(rank)).pow(2).mean())
            engine.step()
        shapes |= {tuple(p.shape) for p in params}
        with gather(params):
            read.append(squares(params))
        with deepspeed.zero.GatheredParameters(params):
            truth.append(squares(params))
    error = max(abs(a - b) / b for a, b in zip(read, truth))
    return {"penalty": read, "truth": truth, "penalty_error": error,
            "shapes_seen": sorted(list(s) for s in shapes)}


# The modules `deepspeed.initialize` imports on first use (its ZeRO optimizer check imports
# DeepSpeed's Muon optimizer, whose torch.compile decorators import torch._inductor): seconds
# per rank, unless the fork server imported them once (`ddp_lab.prewarm(modules=...)`).
DEEPSPEED_MODULES = ("deepspeed", "deepspeed.runtime.engine",
                     "deepspeed.runtime.zero.muon.muon_optimizer")


def wanted_length(rank: int) -> int:
    """After how many forwards a rank's sequence meets its end token: known only when it
    happens, and different per rank."""
    return 3 if rank == 0 else 2


def until_mine_ends(finished: bool) -> bool:
    """Broken: a rank leaves the loop as soon as its own sequence has ended."""
    return not finished


def until_all_end(finished: bool) -> bool:
    """The fix, as transformers' generate(synced_gpus=True) does it (generation/utils.py,
    `_has_unfinished_sequences`): every step, every rank all-reduces whether it is finished
    (0.0 finished, 1.0 not, summed); the loop goes on while any rank is not."""
    import torch.distributed as dist

    flag = torch.tensor(0.0 if finished else 1.0)
    dist.all_reduce(flag)
    return flag.item() > 0


def generate(keep_going=until_mine_ends, seconds: float = 4.0) -> dict:
    """A generate-like loop under ZeRO-3: forward only, while `keep_going(finished)`; a rank
    whose sequence has ended and still runs a forward drops its output. Then a metric summed
    over ranks (the next collective every rank reaches). The rank gives itself `seconds` once
    the engine is set up: a hang is reported that long after it starts."""
    import torch.distributed as dist

    rank = rank_info().rank
    torch.manual_seed(0)
    engine = zero3_engine(mlp())
    restart_clock(seconds)
    wanted, kept, forwards, finished = wanted_length(rank), [], 0, False
    with torch.no_grad():
        while keep_going(finished):
            out = engine(features(rank))  # gathers every partitioned weight from every rank
            forwards += 1
            if finished:
                continue  # this rank's sequence has ended: it runs forward for the others
            kept.append(out)
            finished = len(kept) >= wanted  # its end token
    outputs = torch.tensor([float(len(kept))])
    dist.all_reduce(outputs)
    return {"wanted": wanted, "forwards": forwards, "outputs_all_ranks": int(outputs.item())}


def edit_gathered(weight, value) -> None:
    """A custom init after `deepspeed.initialize`, the ZeRO-3 way for reading: gather, let rank 0
    write, and DeepSpeed partitions rank 0's change again on exit (`modifier_rank=0`). It
    changes the partition forward uses, not the optimizer's float32 master copy."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters([weight], modifier_rank=0):
        if dist.get_rank() == 0:
            with torch.no_grad():
                weight.copy_(value)


def edit_master(weight, value) -> None:
    """The fix after `initialize`: set the float32 master copy the optimizer steps from (every
    rank calls it with the full value and keeps its own partition; deepspeed/utils/
    tensor_fragment.py:154, runtime/zero/stage3.py:3183). The next step carries it into the
    weights forward uses."""
    from deepspeed.utils import safe_set_full_fp32_param

    safe_set_full_fp32_param(weight, value)


def _off_by(weight, value: float) -> float:
    import deepspeed

    with deepspeed.zero.GatheredParameters([weight]):
        return float((weight - value).abs().max())


def zero3_edit(edit=edit_gathered, before_initialize: bool = False, value: float = 0.5) -> dict:
    """Set the last layer's weight to `value`, then take one Adam step (lr 1e-3): how far the
    weight forward sees is from `value` before the step and after it. `before_initialize`:
    build the model under `deepspeed.zero.Init` and edit it there, before `initialize`."""
    rank = rank_info().rank
    torch.manual_seed(0)
    if before_initialize:
        # The config, not `dtype=torch.float32`: DeepSpeed 0.19.8 reads `dtype or float16 if
        # is_fp16_supported() else bfloat16 ...` (runtime/zero/partition_parameters.py:409), so on
        # a CPU without fp16 kernels (mkldnn's check; an AMD EPYC here) a float32 asked for by
        # `dtype` becomes bfloat16 and forward fails on the dtype mismatch. From the config,
        # bf16 and fp16 disabled, it is float32 on every CPU and GPU.
        with deepspeed_ready().zero.Init(config_dict_or_path=CONFIG):
            model = mlp()
        edit(model[4].weight, torch.full(tuple(model[4].weight.ds_shape), value))
    else:
        model = mlp()
    engine = zero3_engine(model)
    weight = model[4].weight
    if not before_initialize:
        edit(weight, torch.full(tuple(weight.ds_shape), value))
    seen = _off_by(weight, value)
    engine.backward(engine(features(rank)).pow(2).mean())
    engine.step()
    return {"off_before_step": seen, "off_after_step": _off_by(weight, value)}
