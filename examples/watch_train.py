"""A training step with the bugs `ddp-lab watch` finds, and each fixed: a statistic kept in a
buffer from each rank's own batch, dropout drawing the same masks on every rank, a loss logged
from one rank's data, a checkpoint saved through the DDP wrapper, a step one rank skips, and a
penalty and a norm read from sharded weights outside forward.

    ddp-lab watch examples/watch_train.py:train_step --model examples/watch_train.py:Net \
        --batches examples/watch_train.py:batches
    ddp-lab watch examples/watch_train.py:train_step_fixed --model examples/watch_train.py:seeded_net \
        --batches examples/watch_train.py:batches --save examples/watch_train.py:save_fixed
"""
import torch
import torch.distributed as dist
from torch import nn


class Net(nn.Module):
    """Two layers with dropout, and a running mean of the inputs kept in a buffer."""

    sync_mean = False

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(32, 1)
        self.register_buffer("input_mean", torch.zeros(16))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                mean = x.mean(0)
                if self.sync_mean:  # the fix: the statistic of all ranks' data
                    dist.all_reduce(mean)
                    mean /= dist.get_world_size()
                self.input_mean.mul_(0.9).add_(0.1 * mean)
        return self.out(self.drop(torch.relu(self.inp(x - self.input_mean))))


class SyncedNet(Net):
    sync_mean = True


def seeded_net():
    """The fix for the random draws: the same seed to build (same weights everywhere), then
    one seed per rank for what is drawn while training (dropout)."""
    torch.manual_seed(0)
    model = SyncedNet()
    torch.manual_seed(1 + dist.get_rank())
    return model


def per_rank_seeded_net():
    """One seed per rank before building: dropout differs, but so do the initial weights, which
    DDP broadcasts from rank 0 and FSDP2 does not."""
    torch.manual_seed(1 + dist.get_rank())
    return SyncedNet()


def batches(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 16, generator=g) + rank
    return x, x.sum(1, keepdim=True)


def _backward(model, optimizer, loss):
    if hasattr(model, "backward"):  # a DeepSpeed engine owns backward and the optimizer
        model.backward(loss)
        model.step()
    else:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def train_step(model, batch, step, optimizer=None):
    """Logs this rank's own loss."""
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    _backward(model, optimizer, loss)
    return loss.item()


def train_step_fixed(model, batch, step, optimizer=None):
    """Logs the loss over every rank's data."""
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    _backward(model, optimizer, loss)
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    return (logged / dist.get_world_size()).item()


def train_step_skips(model, batch, step, optimizer=None):
    """Rank 1 skips step 1 (a per-rank early stop: 'this batch looks bad')."""
    if dist.get_rank() == 1 and step == 1:
        return 0.0
    return train_step_fixed(model, batch, step, optimizer)


def train_step_penalty(model, batch, step, optimizer=None):
    """A weight penalty computed outside forward: under ZeRO-3 from empty placeholders."""
    x, y = batch
    penalty = sum(p.pow(2).sum() for p in model.parameters())
    loss = nn.functional.mse_loss(model(x), y) + 1e-4 * penalty
    _backward(model, optimizer, loss)
    return float(loss)


def train_step_logs_norm(model, batch, step, optimizer=None):
    """Logs the output layer's weight norm, read outside forward: under ZeRO-3 a (0,) placeholder
    (norm 0.0), under FSDP2 this rank's shard of a DTensor."""
    logged = {"loss": train_step_fixed(model, batch, step, optimizer)}
    logged["out_norm"] = getattr(model, "module", model).out.weight.norm().item()
    return logged


def train_step_logs_norm_fixed(model, batch, step, optimizer=None):
    """Logs the norm of the whole weight: gathered under ZeRO-3, full_tensor under FSDP2 (a
    DTensor's own norm is _NormPartial: `.item()` gives this rank's shard's norm, measured)."""
    logged = {"loss": train_step_fixed(model, batch, step, optimizer)}
    weight = getattr(model, "module", model).out.weight
    if hasattr(weight, "ds_status"):
        import deepspeed
        with deepspeed.zero.GatheredParameters([weight]):
            logged["out_norm"] = weight.norm().item()
    elif hasattr(weight, "full_tensor"):
        logged["out_norm"] = weight.full_tensor().norm().item()
    else:
        logged["out_norm"] = weight.norm().item()
    return logged


def evaluate(model, batch):
    """The mean absolute error on this rank's own batch."""
    x, y = batch
    with torch.no_grad():
        return {"mae": (model(x) - y).abs().mean()}


def evaluate_fixed(model, batch):
    """The mean absolute error over every rank's batch: sums and counts summed over the ranks."""
    x, y = batch
    with torch.no_grad():
        sums = torch.stack([(model(x) - y).abs().sum(), y.new_tensor(float(y.numel()))])
    dist.all_reduce(sums)
    return {"mae": sums[0] / sums[1]}


def save(model, path):
    """Saves through the DDP wrapper: every key starts with 'module.'."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def save_module(model, path):
    """The plain module's state: right under DDP; under ZeRO-3 it holds (0,) placeholders."""
    if dist.get_rank() == 0:
        torch.save(getattr(model, "module", model).state_dict(), path)


def save_fixed(model, path):
    """The plain module's whole state, gathered where it is sharded; rank 0 writes it."""
    module = getattr(model, "module", model)
    if hasattr(next(module.parameters()), "ds_status"):  # ZeRO-3: (0,) placeholders outside forward
        import deepspeed
        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            state = {k: v.clone() for k, v in module.state_dict().items()}
    elif hasattr(next(module.parameters()), "full_tensor"):  # FSDP2: DTensor shards
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
    else:
        state = module.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, path)
