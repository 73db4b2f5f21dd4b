"""What each rank runs in lesson 15: a DDP training loop under `torch.compile`, watched by
`ddp_lab.instruments.compilewatch.CompileWatch` (graphs, graph breaks, recompiles, compile seconds). The
backend is `aot_eager` everywhere: dynamo's capture, guards, recompiles and DDPOptimizer's
splits are those of inductor; the kernels are eager ones, so compiling gains nothing.

Each function starts from `torch.compiler.reset()` and restores dynamo's config after it, so
the scenarios can also run one after another in one process (under torchrun).

torch._dynamo is imported inside the functions, not here: listing the lessons must not cost
every process the compiler's imports. `COMPILER_MODULES` is what a rank's first compile
imports; `prepare()` (in the package) has the fork server import them once."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.compilewatch import CompileWatch
from ...launching.rankinfo import ddp_kwargs, device
from .modules import VOCAB, TokenNet, Tower, WarmupGate, WarmupNet, checkpointed_net, features

MAX_LEN = 24  # the longest sequence any rank's batch holds
# What a rank's first torch.compile (aot_eager, under DDP or FSDP2) imports, measured with
# sys.modules before and after: about 290 modules, nearly all under these (dynamo's check of
# context managers imports pytest's).
COMPILER_MODULES = ("torch._dynamo", "torch._inductor.compile_fx", "torch._dynamo.backends.distributed",
                    "torch.distributed.tensor", "torch.export._trace", "torch.utils.checkpoint",
                    "_pytest.fixtures", CompileWatch.__module__, __name__)


def _loss(out) -> torch.Tensor:
    return out.float().pow(2).mean()


def _train(model, batches, watch=None, lr: float = 0.01) -> list[float]:
    """One optimizer step per batch; each step's wall seconds (after `watch.step()`)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    times = []
    for batch in batches:
        start = time.perf_counter()
        _loss(model(*batch)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        if watch is not None:
            watch.step()
    return times


def _compiled_run(build, batches, dynamic=None, **ddp_options) -> dict:
    """The same training twice on this rank: eager (DDP), then under torch.compile (DDP);
    step seconds of each, and what the compiled run compiled."""
    dev = device()
    batches = [tuple(t.to(dev) for t in b) for b in batches]
    torch.manual_seed(0)
    eager = _train(DDP(build().to(dev), **ddp_options, **ddp_kwargs(dev)), batches)
    torch.compiler.reset()
    torch.manual_seed(0)
    with CompileWatch() as watch:
        model = torch.compile(DDP(build().to(dev), **ddp_options, **ddp_kwargs(dev)),
                              backend=watch.backend, dynamic=dynamic)
        compiled = _train(model, batches, watch)
    out = watch.summary()
    out.update(eager_s=eager, step_s=compiled,
               recompiles_after_first=sum(out["recompiles_per_step"][1:]))
    return out


# --- 1. DDPOptimizer: one graph per DDP bucket ------------------------------------------------

def train_buckets(optimize_ddp: bool = True, steps: int = 2, bucket_cap_mb: float = 1.0) -> dict:
    """A `Tower` under DDP (`bucket_cap_mb`: two or more gradient buckets) and torch.compile.
    A comm hook notes, when DDP launches bucket 0's all-reduce, how many compiled backward
    graphs have run: with one graph, all of backward is over before the first all-reduce.

    `bucket_cap_mb` below 1 fails compiled (AssertionError): DDPOptimizer's own first piece is
    1 MiB (torch/_dynamo/convert_frame.py:2606 builds it without `first_bucket_cap`, so
    torch/_dynamo/backends/distributed.py:456-467 takes _DEFAULT_FIRST_BUCKET_BYTES and refuses
    a cap below it); DDP's own first bucket is `bucket_cap_mb` itself
    (torch/nn/parallel/distributed.py:108)."""
    dev = device()
    torch.compiler.reset()
    torch.manual_seed(0)
    launched_after = []  # per step: backward graphs run when bucket 0's all-reduce launched
    from torch._dynamo import config as dynamo_config

    with dynamo_config.patch(optimize_ddp=optimize_ddp), CompileWatch() as watch:
        ddp = DDP(Tower().to(dev), bucket_cap_mb=bucket_cap_mb, **ddp_kwargs(dev))
        buckets = set()

        def hook(state, bucket):
            buckets.add(bucket.index())
            if bucket.index() == 0:
                launched_after.append(watch.backward_runs)
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        model = torch.compile(ddp, backend=watch.backend)
        runs = []
        for step in range(steps):
            before = watch.backward_runs
            _loss(model(torch.randn(32, 256, device=dev))).backward()
            runs.append((launched_after[-1] - before, watch.backward_runs - before))
            watch.step()
    done, total = runs[-1]  # from step 2 on, DDP has rebuilt its buckets in the order grads came
    return {"graphs": len(watch.graphs), "buckets": len(buckets),
            "backward_before_first_bucket": done / total, "backward_graphs_per_step": total,
            "split_reasons": sorted({r for r in watch.reasons if r}),
            "compile_s": sum(watch.summary()["compile_s"])}


# --- 2. Python state that changes every call -------------------------------------------------

def warmup_batches(steps: int) -> list[tuple]:
    g = torch.Generator().manual_seed(1000 * dist.get_rank())
    return [(torch.randn(8, 64, generator=g),) for _ in range(steps)]


def train_warmup(gate_cls=WarmupGate, steps: int = 4) -> dict:
    """`WarmupNet(gate_cls)` under DDP and torch.compile, `steps` steps."""
    return _compiled_run(lambda: WarmupNet(gate_cls), warmup_batches(steps))


# --- 3. ranks whose shapes differ --------------------------------------------------------------

def lengths(rank: int, steps: int) -> list[int]:
    """Sequence lengths of a rank's batches: rank 0's shard holds full-length sequences, the
    others' shards shorter ones of every length (a data pipeline without a common length)."""
    return [MAX_LEN if rank == 0 else 6 + 2 * step for step in range(steps)]


def token_batches(rank: int, steps: int, pad: bool) -> list[tuple]:
    g = torch.Generator().manual_seed(2000 + rank)
    out = []
    for n in lengths(rank, steps):
        ids, mask = torch.randint(1, VOCAB, (4, n), generator=g), torch.ones(4, n)
        if pad:  # every rank pads to MAX_LEN; the mask keeps padding out of the pooling
            ids = torch.nn.functional.pad(ids, (0, MAX_LEN - n))
            mask = torch.nn.functional.pad(mask, (0, MAX_LEN - n))
        out.append((ids, mask))
    return out


def train_ragged(pad: bool = False, steps: int = 4, dynamic=None) -> dict:
    """`TokenNet` under DDP and torch.compile; each rank's batches have its own lengths
    (`pad`: every rank pads to MAX_LEN)."""
    rank = dist.get_rank()
    out = _compiled_run(TokenNet, token_batches(rank, steps, pad), dynamic=dynamic)
    out["lengths"] = [MAX_LEN] * steps if pad else lengths(rank, steps)
    return out


# --- 4. compile + activation checkpointing -------------------------------------------------------

def train_checkpointed(build=checkpointed_net, steps: int = 3) -> dict:
    """A stack of checkpointed blocks (`build()`, default: the broken one) under DDP and
    torch.compile."""
    rank = dist.get_rank()
    batches = [(features(rank) + step,) for step in range(steps)]
    return _compiled_run(build, batches)


__all__ = ["COMPILER_MODULES", "MAX_LEN", "lengths", "token_batches", "train_buckets",
           "train_checkpointed",
           "train_ragged", "train_warmup", "warmup_batches"]
