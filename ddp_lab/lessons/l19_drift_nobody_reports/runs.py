"""What runs on each rank in lesson 19's first two scenarios: a model changed after DDP wrapped
it (a cast, a head replaced), and a trainer that wraps it in one phase and not in the next.
Each rank trains on its own batches, so gradients that are not averaged make the ranks drift;
every step records how far apart they are (`drift_per_step`, max |rank r - rank 0| over every
parameter) and whether a digest of the parameters agrees across ranks."""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import gather, named_drift
from ...launching.rankinfo import ddp_kwargs, device, rank_info
from .modules import Net

LR = 0.05


def batch(rank: int, step: int, dtype=torch.float32):
    """Rank `rank`'s batch at `step` (16 samples, different on every rank)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x.to(dtype), x.sum(1, keepdim=True).to(dtype)


def drift(model) -> float:
    """max |this rank - rank 0| over every parameter of `model` (a collective)."""
    return max(named_drift(dict(model.named_parameters())).values())


def grad_gap(model) -> float:
    """max |this rank's gradient - rank 0's| over every parameter (a collective): 0 when DDP
    averaged them, since every rank then holds the same average."""
    return max(named_drift({n: p.grad for n, p in model.named_parameters()}).values())


def digest(model) -> str:
    """A short hash of every parameter's bytes: equal on every rank when the ranks agree."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


def unregistered(ddp) -> list[str]:
    """The module's parameters that DDP does not know: DDP lists the module's parameters once, when
    it wraps it (`_module_parameters`, private, torch/nn/parallel/distributed.py:895-899). Its
    gradient hooks are the Reducer's, on another list made at the same time
    (`_build_params_for_reducer()`, distributed.py:1059 and 1523-1569), which leaves out
    parameters with requires_grad=False and lists a shared one once. So a parameter created later
    is in neither list and has no hook; a frozen one is in `_module_parameters` and has none
    either. tests/test_private_torch_names.py checks the private name is there."""
    known = {id(p) for p in ddp._module_parameters}
    return [n for n, p in ddp.module.named_parameters() if id(p) not in known]


def change(model, what: str) -> None:
    """The change made to the model: "cast" to float64, or "head" replaced by a new Linear."""
    if what == "cast":
        model.double()
    elif what == "head":
        torch.manual_seed(1)  # the same new head on every rank
        model.head = nn.Linear(model.head.in_features, 1)
    else:
        raise ValueError(f"unknown change {what!r}")


def cast_with_swap() -> None:
    """`model.double()` after `DDP(model)` with `torch.__future__`'s swap flag set: `_apply` then
    swaps each parameter for a new one (torch/nn/modules/module.py:953-955, 975-989) instead of
    setting `.data`, and `torch.utils.swap_tensors` refuses a parameter DDP still holds references
    to: RuntimeError "_apply(): Couldn't swap Linear.weight" (torch 2.13, one rank), loud where
    the default cast is silent."""
    torch.__future__.set_swap_module_params_on_conversion(True)
    dev = device()
    model = Net().to(dev)
    ddp = DDP(model, **ddp_kwargs(dev))  # alive, as a training job's wrapper is: its references
    model.double()                       # to the parameters are what the swap refuses
    del ddp


def train_changed(what: str = "cast", wrap_first: bool = True, steps: int = 4,
                  find_unused_parameters: bool = False) -> dict:
    """DDP training of `Net`, changed by `change(model, what)` after DDP wraps it
    (`wrap_first=True`, the bug) or before (the fix: finish the model, then wrap)."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = Net().to(dev)
    if not wrap_first:
        change(model, what)
    ddp = DDP(model, find_unused_parameters=find_unused_parameters, **ddp_kwargs(dev))
    if wrap_first:
        change(model, what)
    dtype = next(model.parameters()).dtype
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    drifts, agree, grad_gaps = [], [], []
    for step in range(steps):
        x, y = (t.to(dev) for t in batch(info.rank, step, dtype))
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        grad_gaps.append(grad_gap(model))
        opt.step()
        drifts.append(drift(model))
        agree.append(len(set(gather(digest(model)))) == 1)
    return {"drift_per_step": drifts, "drift": drifts[-1], "digests_agree": agree,
            "grad_gap_per_step": grad_gaps,
            "unregistered": unregistered(ddp), "dtype": str(dtype).replace("torch.", "")}


def train_phases(wrapped_in_phase_2: bool = False, steps: int = 4) -> dict:
    """Two phases of training, as a trainer that pre-trains then fine-tunes does: phase 1 steps
    through the DDP wrapper; phase 2 through the wrapper too (the fix) or through the bare
    module (`wrapped_in_phase_2=False`, the bug: a trainer that skips DDP, or calls
    `ddp.module`, for its second phase). After each backward: how far the ranks' gradients
    are apart; after each step: how far their parameters are."""
    info, dev = rank_info(), device()
    torch.manual_seed(0)
    model = Net().to(dev)
    ddp = DDP(model, **ddp_kwargs(dev))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    drifts, grad_gaps = [], []
    for phase in (1, 2):
        runner = ddp if phase == 1 or wrapped_in_phase_2 else model
        for step in range(steps):
            x, y = (t.to(dev) for t in batch(info.rank, 10 * phase + step))
            loss = nn.functional.mse_loss(runner(x), y)
            opt.zero_grad()
            loss.backward()
            grad_gaps.append(grad_gap(model))
            opt.step()
            drifts.append(drift(model))
    return {"drift_per_step": drifts, "drift": drifts[-1], "grad_gap_per_step": grad_gaps,
            "phase_steps": steps}


def step_through(model, batch, step, optimizer):
    """A `ddp_lab.watch` train step (`model` is the DDP wrapper) that trains through the
    wrapper for 2 steps, then through `model.module`: a second phase that skips DDP."""
    x, y = batch
    runner = model if step < 2 else model.module
    loss = nn.functional.mse_loss(runner(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def watch_batches(rank: int, step: int):
    """The batches `ddp_lab.watch` feeds each rank."""
    return batch(rank, step)
