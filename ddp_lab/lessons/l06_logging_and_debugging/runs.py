"""The per-rank code of lesson 06: the training loops a learner debugs. Every function here runs
on a rank (through `ddp_lab.launch`, or under torchrun: see `runs_torchrun.py`)."""
from __future__ import annotations

import logging
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ...instruments.probes import Timeline
from ...launching.rankinfo import ddp_kwargs, device, rank_info, scratch_dir
from ...instruments.logs import get_logger


def _ddp(build, *args, seed: int = 0):
    """`build(*args)`, seeded (the same weights on every rank and every run), wrapped in DDP."""
    dev = device()
    torch.manual_seed(seed)
    return DDP(build(*args).to(dev), **ddp_kwargs(dev)), dev


# -- 1. who prints ----------------------------------------------------------------------------

def print_and_log(log, text: str) -> None:
    """What most scripts do: print, and log through the root logger, on every rank."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(text)
    logging.getLogger("script").info(text)


def rank_log(log, text: str) -> None:
    """The rank-aware logger: rank 0 on the console, every rank in its own record."""
    log.info(text)


def train_and_log(report=print_and_log, steps: int = 3) -> dict:
    """A few DDP steps; each rank reports its own loss, then "training done"."""
    info, log = rank_info(), get_logger("train")
    model, dev = _ddp(nn.Linear, 4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(info.rank + 1)
    for step in range(steps):
        loss = model(torch.randn(8, 4, device=dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        report(log, f"step {step}: loss {loss.item():.4f}")
    report(log, "training done")
    return {"steps": steps}


# -- 2. one rank fails ------------------------------------------------------------------------

VOCAB = ["the", "a", "model", "rank", "loss", "step", "grad", "data", "batch", "shard"]
EOS = len(VOCAB)  # "<eos>", added to the tokenizer after the model was built


def token_batch(rank: int, step: int, bad_rank: int | None, bad_step: int = 1) -> torch.Tensor:
    """A batch of token ids; `bad_rank`'s shard holds an <eos> token at `bad_step`."""
    ids = torch.randint(0, len(VOCAB), (8, 6), generator=torch.Generator().manual_seed(10 * rank + step))
    if rank == bad_rank and step == bad_step:
        ids[3, -1] = EOS
    return ids


class TokenModel(nn.Module):
    def __init__(self, vocab_size: int = len(VOCAB)):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(1))


def train_tokens(vocab_size: int = len(VOCAB), bad_rank: int | None = 1, steps: int = 3) -> dict:
    """DDP steps of TokenModel(vocab_size) on token batches; rank `bad_rank` meets <eos>."""
    info, log = rank_info(), get_logger("train")
    model, dev = _ddp(TokenModel, vocab_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        log.debug("step %d: forward", step)
        loss = model(token_batch(info.rank, step, bad_rank).to(dev)).pow(2).mean()
        log.debug("step %d: backward", step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"steps": steps}


# -- 3. TORCH_DISTRIBUTED_DEBUG on an unused parameter ----------------------------------------

class AuxNet(nn.Module):
    """An auxiliary head that forward never uses."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux_head = nn.Linear(4, 2)

    def forward(self, x):
        return self.body(x)


class BothHeads(AuxNet):
    """The same two heads, both used: nothing for DDP to complain about."""

    def forward(self, x):
        return torch.cat([self.body(x), self.aux_head(x)], dim=1)


def detail_after_init() -> None:
    """The workaround for this build's crash: DETAIL set after the process group exists. The
    group stays unwrapped (no collective checks); DDP, built after this, reads DETAIL."""
    dist.set_debug_level(dist.DebugLevel.DETAIL)


def train_aux(model_cls=AuxNet, steps: int = 2, detail_late: bool = False) -> dict:
    """A few DDP steps of `model_cls` (by default the one with the unused head); with
    `detail_late`, TORCH_DISTRIBUTED_DEBUG=DETAIL is set after init_process_group."""
    if detail_late:
        detail_after_init()
    model, dev = _ddp(model_cls)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4, device=dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"steps": steps, "debug_level": str(dist.get_debug_level()).split(".")[-1]}


def mismatched_collectives(detail_late: bool = False) -> dict:
    """Rank 0 all-reduces while rank 1 broadcasts: a bug no debug level prevents. Under DETAIL
    from the start the group is wrapped and compares the two calls before running them."""
    if detail_late:
        detail_after_init()
    backend = type(dist.group.WORLD._get_backend(torch.device(device()))).__name__
    t = torch.ones(4, device=device())
    if rank_info().rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    return {"backend": backend}


# -- 4. a rank stuck outside any collective ---------------------------------------------------

def wait_for_file(path: str, poll_s: float = 0.02) -> None:
    # os.access and time.sleep are C calls, so this function is the innermost Python frame
    # whenever the rank's stack is taken; os.path.exists is Python (genericpath.exists), and a
    # clean-clone CI run once caught the rank inside it, which changed notebook 06's output
    while not os.access(path, os.F_OK):
        time.sleep(poll_s)


def prepare_then_share(barrier_first: bool = True) -> dict:
    """Rank 0 prepares a data file the other ranks read. With `barrier_first`, rank 0 first
    waits at a barrier "until everyone is ready" while the others wait for the file before
    joining the barrier; without, rank 0 writes, then every rank meets at the barrier."""
    info = rank_info()
    # mkdtemp: a new folder only this user can open, under a name nobody can guess (a shared
    # /tmp lets anyone create a folder or link at a predictable name before rank 0 does); in the
    # launch's scratch folder, which the launcher removes even when it has to kill the ranks
    box = [tempfile.mkdtemp(prefix="ddp-lab-l06-", dir=scratch_dir()) if info.is_main else None]
    dist.broadcast_object_list(box)
    path = os.path.join(box[0], "data.pt")
    if info.is_main:
        if barrier_first:
            dist.barrier()
        torch.save(torch.arange(6.0), path)
        if not barrier_first:
            dist.barrier()
    else:
        if barrier_first:
            wait_for_file(path)
        dist.barrier()
    total = torch.load(path).sum().item()
    dist.barrier()  # everyone has read it
    if info.is_main:
        os.remove(path)
        os.rmdir(box[0])
    return {"total": total}


# -- 5. a straggler ---------------------------------------------------------------------------

def _timed_allreduce(timeline: Timeline, bucket):
    """A DDP communication hook: DDP's own all-reduce, recorded as a span from the moment the
    bucket is ready to the moment every rank has contributed."""
    start = time.perf_counter() - timeline.t0
    fut = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()

    def done(f):
        timeline.spans.append(("all_reduce (DDP)", start, time.perf_counter() - timeline.t0))
        return f.value()[0]

    return fut.then(done)


def straggler(slow_rank: int | None = 1, delay_s: float = 0.15, steps: int = 4) -> dict:
    """DDP steps where rank `slow_rank` spends `delay_s` more loading each batch."""
    info = rank_info()
    model, dev = _ddp(lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timeline = Timeline()
    model.register_comm_hook(timeline, _timed_allreduce)
    torch.manual_seed(info.rank + 1)
    warm_up = 2  # DDP rebuilds its buckets in step 1's forward (a collective): not timed
    for step in range(warm_up + steps):
        if step == warm_up:
            timeline.align()
            timeline.spans.clear()
        with timeline.span("data"):
            x = torch.randn(64, 32, device=dev)
            if info.rank == slow_rank and step >= warm_up:
                time.sleep(delay_s)  # this rank's loader is slower
        with timeline.span("forward + backward"):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
        with timeline.span("optimizer step"):
            opt.step()
    waits = [e - s for n, s, e in timeline.spans if n == "all_reduce (DDP)"]
    return {"spans": timeline.spans, "wait_s": sum(waits) / len(waits)}
