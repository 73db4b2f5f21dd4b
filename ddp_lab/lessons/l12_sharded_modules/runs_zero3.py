"""What runs on each rank in lesson 12's DeepSpeed ZeRO-3 scenarios. DeepSpeed is imported
inside these functions only, so lessons that never use it do not pay for its import.

Every function here runs on a rank (through `ddp_lab.launch`); none starts a process.
"""
from __future__ import annotations

import contextlib

import torch

from ...launching.rankinfo import rank_info, restart_clock
from .modules import features, mlp

CONFIG = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 3},
          # a torch optimizer: DeepSpeed refuses one it has not tested unless told
          "zero_allow_untested_optimizer": True}


def zero3_engine(model, stage: int = 3):
    """`deepspeed.initialize` on the launcher's gloo group (DeepSpeed picks its CPU
    accelerator when there is no GPU). On CPU, refuses to start if DeepSpeed's C++ op is not
    built yet, rather than compile it for minutes inside this rank (`ddp-lab build-ops`)."""
    if not torch.cuda.is_available():
        from ...instruments.deepspeed_ops import require_built
        require_built()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else "nccl")
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
    """How many forwards a rank's generate loop wants: decided per rank (its sequence met its
    end token sooner)."""
    return 3 if rank == 0 else 2


def own_length(wanted: int) -> int:
    return wanted


def agreed_length(wanted: int) -> int:
    """The fix: every rank runs the longest loop of all ranks (what transformers'
    generate(synced_gpus=True) does); a rank that is done keeps calling forward and drops it."""
    import torch.distributed as dist

    n = torch.tensor([wanted])
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def generate(length=own_length, seconds: float = 4.0) -> dict:
    """A generate-like loop under ZeRO-3: forward only, as many times as `length` says, then a
    metric summed over ranks (the next collective every rank reaches). The rank gives itself
    `seconds` once the engine is set up: a hang is reported that long after it starts."""
    import torch.distributed as dist

    rank = rank_info().rank
    torch.manual_seed(0)
    engine = zero3_engine(mlp())
    restart_clock(seconds)
    wanted = wanted_length(rank)
    forwards = length(wanted)
    kept = []
    with torch.no_grad():
        for step in range(forwards):
            out = engine(features(rank))  # gathers every partitioned weight from every rank
            if step < wanted:
                kept.append(out)
    outputs = torch.tensor([float(len(kept))])
    dist.all_reduce(outputs)
    return {"wanted": wanted, "forwards": forwards, "outputs_all_ranks": int(outputs.item())}
