"""Torch's own code run outside watch's TorchFunctionMode (watch/unwatched.py), in this process
with the core installed and its mode on: a torch.optim optimizer's step and its zero_grad to
None, a DataLoader's next batch reach no check's handler; the script's own calls, an optimizer
step the script wrote, `zero_grad(set_to_none=False)` and everything while a check follows
every call still do."""
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ddp_lab.doctor.checks.context import Context
from ddp_lab.doctor.watch.core import function_mode, install_core


@pytest.fixture
def watched(tmp_path):
    """(ctx, the functions a handler saw): a handler on Tensor.add_ and Tensor.zero_."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    ctx = Context(str(script))
    undo = install_core(ctx)
    seen: list = []
    ctx.on_torch_function([torch.Tensor.add_, torch.Tensor.zero_],
                          lambda f, a, k, out: seen.append(f.__name__))
    ctx.mode = function_mode(ctx)
    with ctx.mode:
        yield ctx, seen
    for u in reversed(undo):
        u()
    ctx.finish()


def one_step(opt, model, **zero):
    opt.zero_grad(**zero)
    model(torch.ones(2, 3)).sum().backward()
    opt.step()


def test_a_torch_optimizers_step_is_unwatched_and_the_scripts_own_calls_are_not(watched):
    ctx, seen = watched
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # p.add_ per parameter
    one_step(opt, model)
    assert seen == [] and ctx.step == 1
    torch.ones(2).add_(1)  # the script's own
    assert seen == ["add_"]
    assert getattr(torch.optim.SGD.step, "hooked", False)  # torch's step hooks not added twice


def test_zero_grad_without_none_stays_watched(watched):
    ctx, seen = watched
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    one_step(opt, model)
    one_step(opt, model, set_to_none=False)
    assert seen.count("zero_") == 2  # weight's and bias's gradients zeroed in place


def test_while_a_check_follows_every_call_nothing_is_aside(watched):
    ctx, seen = watched
    every: list = []
    switch = ctx.on_every_torch_function(lambda f, a, k, out: every.append(f))
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    model(torch.ones(2, 3)).sum().backward()
    switch(True)
    opt.step()
    switch(False)
    assert seen == ["add_", "add_"] and every


def test_an_optimizer_step_the_script_wrote_stays_watched(watched):
    ctx, seen = watched

    class Mine(torch.optim.SGD):
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.add_(p.grad, alpha=-group["lr"])

    model = torch.nn.Linear(3, 1)
    one_step(Mine(model.parameters(), lr=0.1), model)
    assert seen == ["add_", "add_"]


def test_a_dataloaders_batches_are_unwatched(watched):
    ctx, seen = watched

    class Rows(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(2).add_(i)

    batches = list(DataLoader(Rows(), batch_size=2))
    assert seen == [] and batches[1].tolist() == [[2.0, 2.0], [3.0, 3.0]]
