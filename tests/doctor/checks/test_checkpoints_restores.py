"""What a module is restored from (checks/_checkpoints_restores.py), in this process: real
modules, optimizers and torch.save/torch.load through watch's core and the checkpoints check,
the judge on the records. On 2 ranks under watch: the blind cases b52 (a "best" state kept by
reference) and b62 (an EMA restored from the live model on resume), tests/corpus/."""
import copy

import pytest
import torch

from ddp_lab.doctor.checks import checkpoints
from ddp_lab.doctor.checks.api import Evidence
from ddp_lab.doctor.checks.context import Context
from ddp_lab.doctor.watch.core import install_core


@pytest.fixture
def ctx():
    ctx = Context(__file__)  # this file is the user's
    undo = install_core(ctx)
    state_dict, load_state_dict = torch.nn.Module.state_dict, torch.nn.Module.load_state_dict
    save, load = torch.save, torch.load
    checkpoints.attach(ctx)
    yield ctx
    torch.nn.Module.state_dict, torch.nn.Module.load_state_dict = state_dict, load_state_dict
    torch.save = torch.serialization.save = save
    torch.load = torch.serialization.load = load
    for u in reversed(undo):
        u()
    ctx.finish()


def train(model, opt, steps=1):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()


def findings(ctx):
    ev = Evidence(ranks=[{"restores": ctx.records.get("restores", [])}])
    return [(f.code, f.where.split(": ", 1)[1]) for f in checkpoints.judge(ev)]


@pytest.mark.parametrize("copied", [False, True])
def test_a_state_kept_by_reference_restores_nothing_and_is_named_where_it_was_taken(ctx, copied):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, opt)
    best = model.state_dict()  # the best so far
    if copied:
        best = copy.deepcopy(best)
    train(model, opt, 2)
    model.load_state_dict(best)
    assert findings(ctx) == ([] if copied else [
        ("state-dict-by-reference", "best = model.state_dict()  # the best so far")])


def test_a_state_taken_and_loaded_in_the_same_step_is_not_judged(ctx):
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(model.state_dict())
    assert findings(ctx) == []


def resume(ctx, tmp_path, ema_from):
    model, ema = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.save({"model": model.state_dict(), "ema": ema.state_dict()}, tmp_path / "c.pt")
    ckpt = torch.load(tmp_path / "c.pt", weights_only=True)
    model.load_state_dict(ckpt["model"])
    ema.load_state_dict(ckpt["ema"] if ema_from == "file" else model.state_dict())
    train(model, opt, 2)


def test_a_module_restored_from_a_live_one_over_its_checkpoint_entry_is_named(ctx, tmp_path):
    resume(ctx, tmp_path, "live")
    assert findings(ctx) == [("checkpoint-state-not-restored",
                              'ema.load_state_dict(ckpt["ema"] if ema_from == "file" else model.state_dict())')]


def test_the_checkpoints_own_entry_restored_is_no_finding(ctx, tmp_path):
    resume(ctx, tmp_path, "file")
    assert findings(ctx) == []


def test_an_ema_started_from_the_model_without_a_checkpoint_is_no_finding(ctx):
    model, ema = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    ema.load_state_dict(model.state_dict())
    train(model, torch.optim.SGD(model.parameters(), lr=0.1), 2)
    assert findings(ctx) == []
