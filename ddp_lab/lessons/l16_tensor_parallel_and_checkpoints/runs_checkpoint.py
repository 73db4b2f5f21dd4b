"""Lesson 16's checkpoints, on each rank: a model split over 2 ranks saves, then 4 ranks (and
1) load what it saved. One job of 4 processes plays the three worlds: ranks 0-1 form the
2-rank mesh that writes, all 4 ranks the mesh that reads, rank 0 alone the 1-rank reader;
each mesh has its own process group, so every collective is a real one among its ranks.

The files live in a temporary directory that rank 0 creates and removes; every rank works
inside it, so no machine path reaches a message. One machine: the ranks share its disk
(across machines, DCP needs a shared file system or another storage backend).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

from ...launching.rankinfo import device, rank_info, scratch_dir
from .modules import Noisy, TinyLMFixed, features, tokens
from .runs import is_dtensor, mesh_of, whole


@contextlib.contextmanager
def checkpoint_dir():
    """A fresh directory every rank works in (its working directory meanwhile), removed after."""
    rank, here = rank_info().rank, os.getcwd()
    path = [tempfile.mkdtemp(prefix="ddp-lab-l16-", dir=scratch_dir()) if rank == 0 else None]
    dist.broadcast_object_list(path, src=0)
    os.chdir(path[0])
    try:
        yield
    finally:
        os.chdir(here)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path[0], ignore_errors=True)


def save_per_rank(model, group=None) -> None:
    """What many training scripts do: each rank writes its own shard of every tensor."""
    local = {k: v.to_local() if is_dtensor(v) else v for k, v in model.state_dict().items()}
    torch.save(local, f"rank{dist.get_rank()}.pt")


def load_per_rank(model, group=None) -> None:
    model.load_state_dict(torch.load(f"rank{dist.get_rank()}.pt"))


def save_dcp(state, group=None) -> None:
    """The fix: torch.distributed.checkpoint writes each shard once, with where it belongs."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state if isinstance(state, dict) else {"model": state}, checkpoint_id="dcp",
             process_group=group)


def load_dcp(state, group=None) -> None:
    """DCP reads into what `state` holds now (this world's shards), whatever wrote the files."""
    import torch.distributed.checkpoint as dcp

    dcp.load(state if isinstance(state, dict) else {"model": state}, checkpoint_id="dcp",
             process_group=group)


def split(model, mesh):
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model.to(device()), mesh, model.tp_plan())


def trained(mesh, steps: int = 2):
    """TinyLMFixed split over `mesh`, after `steps` SGD steps."""
    torch.manual_seed(0)
    model = split(TinyLMFixed(), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(steps):
        model(tokens(step).to(device())).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model


def written() -> list[str]:
    """The files in the checkpoint directory, by their path inside it."""
    return sorted(os.path.relpath(os.path.join(d, f)) for d, _, names in os.walk(".")
                  for f in names)


def largest_difference(model, saved: dict) -> float:
    return max(float((whole(v).cpu() - saved[k]).abs().max()) for k, v in model.state_dict().items())


def reshard(save=save_per_rank, load=load_per_rank) -> dict:
    """Save at 2 ranks, load at 4 and at 1; how far each loaded tensor is from what was saved."""
    rank = rank_info().rank
    with checkpoint_dir():
        two, four = mesh_of(2), mesh_of(4)
        writers, alone = dist.new_group([0, 1]), dist.new_group([0])
        saved = [None]
        if rank < 2:
            model = trained(two)
            saved = [{k: whole(v).detach().cpu().clone() for k, v in model.state_dict().items()}]
            save(model, writers)
        dist.broadcast_object_list(saved, src=0)  # what was saved, for every rank to compare
        torch.manual_seed(1)  # other weights: a load that does nothing is seen
        at4 = split(TinyLMFixed(), four)
        load(at4, None)
        out = {"max_diff_at_4": largest_difference(at4, saved[0]),
               "files": written(),
               "local_rows_at_4": tuple(at4.emb.weight.to_local().shape)}
        if rank == 0:
            torch.manual_seed(2)
            at1 = TinyLMFixed().to(device())  # one process, no mesh: plain tensors
            load(at1, alone)
            out["max_diff_at_1"] = largest_difference(at1, saved[0])
        out["max_diff"] = max(v for k, v in out.items() if k.startswith("max_diff_at"))
    return out


class NoisyState:
    """The fix: what the checkpoint must carry besides the weights, in DCP's `Stateful`
    protocol (state_dict / load_state_dict). DCP calls state_dict() when it saves, and again
    when it loads (to learn what to read into), then load_state_dict() with what it read."""

    def __init__(self, block: Noisy):
        self.block = block

    def state_dict(self) -> dict:
        return {"steps": self.block.steps, "center": self.block.center,
                "noise": self.block.noise.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.block.steps = state["steps"]
        self.block.center.copy_(state["center"])
        self.block.noise.set_state(state["noise"])


def weights_only(block) -> dict:
    """What DCP's recipe saves: the module (an nn.Module is Stateful: its state_dict())."""
    return {"model": block}


def weights_and_state(block) -> dict:
    return {"model": block, "state": NoisyState(block)}


def train(block, steps: int) -> None:
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    for step in range(steps):
        block(features(step).to(device())).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def resume(state=weights_only, steps: int = 3) -> dict:
    """Train `Noisy` split over 2 ranks, checkpoint `state(block)`, take one more training
    forward; rank 0 alone resumes into a fresh unsplit block and takes the same forward. The
    relative difference of the two outputs: 0 up to rounding when the resume is complete."""
    rank = rank_info().rank
    with checkpoint_dir():
        two, alone = mesh_of(2), dist.new_group([0])
        torch.manual_seed(0)
        block = split(Noisy(), two)
        train(block, steps)
        save_dcp(state(block))
        x = features(steps).to(device())
        went_on = whole(block(x)).detach()  # the run that was not interrupted
        out = {}
        if rank == 0:
            torch.manual_seed(1)
            fresh = Noisy().to(device())  # a new process would start from here
            load_dcp(state(fresh), alone)
            resumed = fresh(x).detach()
            out = {"resume_error": float((resumed - went_on).norm() / went_on.norm()),
                   "steps": (block.steps, fresh.steps),
                   "center_moved": float((fresh.center - block.center).abs().max())}
    return out
