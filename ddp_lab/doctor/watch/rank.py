"""One rank of a `watch` run: build the user's model, wrap it as the strategy does (DDP, FSDP2's
fully_shard, DeepSpeed ZeRO-3), run the user's own `train_step` for a few steps, and after each
write what it saw (`sync.emit`: it comes back even from a rank that fails or hangs later)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ...instruments.deepspeed_ops import require_built
from ...launching.rankinfo import device, rank_info
from ..batch import move
from ..checks.api import Context
from ..sync import emit
from ..userline import describe
from .core import attach_checks, function_mode, install_core, record_error
from .instruments import dropout_hooks, state_hashes, step_watcher

LR = 0.05


class WatchInputError(ValueError):
    """The step function or its settings do not fit: the message says what to change."""


def wrap(model, strategy: str, make_optimizer):
    """(what train_step receives, its optimizer) under `strategy`."""
    import torch

    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model), make_optimizer(model.parameters())
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for child in [c for c in model.children() if any(True for _ in c.parameters())]:
            fully_shard(child)
        fully_shard(model)
        return model, make_optimizer(model.parameters())
    if not torch.cuda.is_available():
        require_built()
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, opt, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(model.parameters()),
                                           config=cfg)
    return engine, opt


def logged(value, step: int, by: str = "train_step") -> dict[str, float]:
    """What the step (or `by`, e.g. evaluate) returned, as {name: number}; a WatchInputError
    when it is nothing."""
    import torch

    if value is None:
        raise WatchInputError(
            f"{by} returned None at step {step}: return what you log (the loss as a "
            "float or a 0-dim tensor, or a dict like {'loss': loss}) so that watch can compare "
            "it with the value over all ranks' data")
    items = value.items() if isinstance(value, dict) else [("loss", value)]
    out = {}
    for name, v in items:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            v = v.item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise WatchInputError(f"{by} returned {type(v).__name__} for {name!r} at step "
                                  f"{step}: return numbers (floats or 0-dim tensors)")
        out[str(name)] = float(v)
    return out


def one_step(step_fn, wrapped, model, batch, step, kwargs, strategy) -> dict:
    masks: dict = {}
    hooks = dropout_hooks(model, masks)
    watcher = step_watcher(model)
    record = {"begin": time.time()}
    try:
        start = time.perf_counter()
        with watcher:
            value = step_fn(wrapped, batch, step, **kwargs)
        record["step_s"] = time.perf_counter() - start
    finally:
        for h in hooks:
            h.remove()
        record.update(losses=watcher.losses, reads=watcher.reads, masks=masks)
        emit(f"step{step}", record)  # what it saw, even when the step raised
    start = time.perf_counter()
    record.update(logged=logged(value, step), state=state_hashes(model, strategy))
    record["checks_s"] = time.perf_counter() - start
    emit(f"step{step}", record)
    return record


def full_state(model, strategy: str) -> dict:
    """name -> the whole value of every parameter and buffer of the plain module, on every rank
    (FSDP2's full_tensor and ZeRO-3's gather are collectives: every rank calls this)."""
    if strategy == "zero3":
        import deepspeed
        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in model.state_dict().items()}


# Where a checkpoint of several parts keeps the model's weights, as training scripts name it.
WEIGHTS_UNDER = ("model", "state_dict", "model_state_dict", "model_state", "module")


def reload_check(factory, path: str, full: dict) -> dict:
    """Load what the user's save wrote into a fresh plain module: PyTorch's error, or the first
    tensor whose value differs from the trained model's."""
    import os

    import torch

    if not os.path.exists(path):
        return {"error": f"save() wrote nothing at the path it was given ({os.path.basename(path)})"}
    state = torch.load(path, map_location="cpu", weights_only=False)
    for key in WEIGHTS_UNDER:  # a checkpoint that holds more than the weights
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
            break
    plain = factory()
    try:
        plain.load_state_dict(state)
    except Exception as exc:  # PyTorch's own message is the evidence
        return {"error": f"{type(exc).__name__}: {str(exc).strip()}"}
    for name, value in plain.state_dict().items():
        if name in full and not torch.equal(value, full[name].to(value.dtype)):
            off = float((value.float() - full[name].float()).abs().max())
            return {"differs": name, "off": off}
    return {"ok": True}


def _where_defined(*fns) -> list[str]:
    """The folders of the files the user's functions come from (their code is the user's)."""
    import os

    out = []
    for fn in fns:
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__init__", None), "__code__", None)
        if code is not None and not code.co_filename.startswith("<"):
            out.append(os.path.dirname(os.path.abspath(code.co_filename)))
    return out


def returned_line(fn) -> str:
    """"file.py:12: return loss.item()": the last return line of the user's function."""
    import ast
    import inspect
    import textwrap

    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    try:
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        returns = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Return)]
        lineno = first + max(returns) - 1 if returns else code.co_firstlineno
    except (OSError, TypeError, SyntaxError, ValueError):
        lineno = code.co_firstlineno
    return describe(code.co_filename, lineno)


@dataclass(frozen=True)
class StepRun:
    """What each rank of the function API runs: the user's functions and watch's settings."""

    train_step: Callable
    model: Callable  # the zero-argument factory
    batches: Callable  # (rank, step) -> batch
    strategy: str = "ddp"
    steps: int = 3
    save: Callable | None = None
    evaluate: Callable | None = None
    optimizer: Callable | None = None  # (params) -> the optimizer train_step is given
    wants_optimizer: bool = False  # train_step takes optimizer=
    checkpoint: str = ""  # the path `save` writes to
    records: str = ""  # each rank's records file, "{}" for the rank
    returned_at: str = ""  # the user's line train_step returns from (what it logs)


def body(job: StepRun) -> dict:
    """The rank's whole run; what it returns is plain data. The registry's checks attach
    here as they do to a script (core.py): the same Context, the same hooks."""
    import contextlib

    import torch

    step_fn, factory, batches, strategy = job.train_step, job.model, job.batches, job.strategy
    save, evaluate, make_optimizer = job.save, job.evaluate, job.optimizer
    code = getattr(step_fn, "__code__", None)
    ctx = Context(code.co_filename if code else "train_step.py",
                  job.records.format(rank_info().rank) if job.records else None,
                  _where_defined(step_fn, factory, batches, save, evaluate), dynamic=True)
    ctx.steps_by_optimizer = False  # a step is one call of train_step
    install_core(ctx)
    attach_checks(ctx, None)
    ctx.emit("started", True)
    ctx.group_started = True
    ctx.emit("group", {"backend": torch.distributed.get_backend(), "line": ""})
    rank, dev = rank_info().rank, device()  # cuda:LOCAL_RANK under NCCL, else the CPU
    ctx.mode = function_mode(ctx)
    mode = ctx.mode or contextlib.nullcontext()
    try:
        with mode:
            model = factory().to(dev)
            emit("init", state_hashes(model, "ddp"))
            make_optimizer = make_optimizer or (lambda params: torch.optim.SGD(params, lr=LR))
            wrapped, opt = wrap(model, strategy, make_optimizer)
            kwargs = {"optimizer": opt} if job.wants_optimizer else {}
            seconds = []
            for step in range(job.steps):
                batch = move(batches(rank, step), dev)
                rec = one_step(step_fn, wrapped, model, batch, step, kwargs, strategy)
                seconds.append((rec["step_s"], rec["checks_s"]))
                ctx.add("logged.value", {"s": ctx.step, "v": list(rec["logged"].values()),
                                         "line": job.returned_at})  # what the step returns is logged
                ctx.step_ended(None)
            if evaluate is not None:
                emit("evaluate", logged(evaluate(wrapped, move(batches(rank, job.steps), dev)),
                                        job.steps, "evaluate"))
            if save is not None:
                save(wrapped, job.checkpoint)
                if strategy == "zero3":  # the checkpoints check cannot gather ZeRO-3's parameters
                    full = full_state(model, strategy)
                    if rank == 0:
                        emit("reload", reload_check(factory, job.checkpoint, full))
    except BaseException as exc:
        if not isinstance(exc, WatchInputError):
            record_error(ctx, exc)
        raise
    finally:
        ctx.finish()
    return {"seconds": seconds}
