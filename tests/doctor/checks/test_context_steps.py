"""The floor's step counter (checks/_context_steps.py, under `Context.step_ended`): which
optimizer's `step()` ends a step of the user's loop. Real torch optimizers stepping through the
core's own hook (watch/core.py, install_core), in this process: a rebuilt optimizer (a resume that
builds a new one and loads the old one's state) keeps counting steps, and the old one is not kept
alive; a second optimizer over other parameters (a GAN's) does not end a step of its own."""
import gc
import weakref

import pytest
import torch

from ddp_lab.doctor.checks.context import Context
from ddp_lab.doctor.watch.core import install_core


@pytest.fixture
def ctx(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    ctx = Context(str(script))
    undo = install_core(ctx)
    yield ctx
    for u in reversed(undo):
        u()
    ctx.finish()


def train(opt, model, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()


def test_a_rebuilt_optimizer_keeps_counting_steps_and_the_old_one_is_freed(ctx):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    train(opt, model, 3)
    assert ctx.step == 3
    state = opt.state_dict()
    old = weakref.ref(opt)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)  # the resume: a new optimizer, the old state
    opt.load_state_dict(state)
    del state
    gc.collect()
    assert old() is None, "the step counter keeps the script's old optimizer alive"
    train(opt, model, 4)
    assert ctx.step == 7, "the rebuilt optimizer's steps are not counted"


def test_the_newest_optimizer_of_the_same_parameters_counts_while_the_old_one_lives(ctx):
    model = torch.nn.Linear(3, 1)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    train(first, model, 2)
    second = torch.optim.SGD(model.parameters(), lr=0.1)  # the old one still held by the script
    train(second, model, 2)
    assert ctx.step == 4
    for _ in range(2):  # both step each iteration from here: one step per iteration, not two
        first.step()
        second.step()
    assert ctx.step == 6, "a replaced optimizer ends steps again"


def test_a_second_optimizer_over_other_parameters_steps_inside_the_step(ctx):
    generator, critic = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    opt_g = torch.optim.Adam(generator.parameters(), lr=0.1)
    opt_c = torch.optim.Adam(critic.parameters(), lr=0.1)
    for _ in range(5):
        for opt in (opt_c, opt_g):
            opt.zero_grad()
            critic(generator(torch.ones(2, 3))).sum().backward()
            opt.step()
    assert ctx.step == 5


def test_any_optimizer_counts_once_the_one_that_counted_is_gone(ctx):
    model = torch.nn.Linear(3, 1)
    train(torch.optim.SGD(model.parameters(), lr=0.1), model, 2)
    gc.collect()
    head = torch.nn.Linear(3, 1)  # a new phase: another model, another optimizer
    train(torch.optim.SGD(head.parameters(), lr=0.1), head, 3)
    assert ctx.step == 5
