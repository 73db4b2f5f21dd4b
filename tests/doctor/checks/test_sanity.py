"""Watch check "sanity" (ddp_lab/doctor/checks/sanity.py): a finite loss and finite parameters
from the first step, and every tensor to_empty materialises initialised before the first step.
Each code has failing tests (a small script, the step or the user's line at fault) and passing
ones (the same script made right, or the legitimate look-alike: a non-finite step skipped)."""
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script

CODES = ("non-finite-parameters", "non-finite-loss", "parameters-never-initialised")


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


def run(tmp_path, body, blocks="pass"):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("BODY", textwrap.indent(textwrap.dedent(body), "    "))
                    .replace("INIT_BLOCKS", blocks))
    report = watch_script(str(path), nproc=2, timeout=60, checks=["sanity"])
    assert all(not r.get("check-errors") for r in report.evidence.ranks), \
        [r.get("check-errors") for r in report.evidence.ranks]
    return path, [f for f in report.findings if f.code in CODES], report


SCRIPT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x)

    def init_weights(self):
        self.embed.reset_parameters()
        INIT_BLOCKS
        self.head.reset_parameters()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
BODY
    dist.destroy_process_group()


main()
"""

LOOP = """
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(8, 4)
    {poison}
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    {step}
"""


@pytest.mark.parametrize("poison, step, code", [
    ("x[0, 0] = float('nan') if step == 2 else x[0, 0]", "opt.step()", "non-finite-parameters"),
    ("x[0, 0] = float('inf') if step == 2 else x[0, 0]",
     "opt.step() if torch.isfinite(loss) else None  # as GradScaler skips it", "non-finite-loss"),
    ("pass", "opt.step()", None)])
def test_a_non_finite_loss_or_parameter_is_found_at_its_first_step(tmp_path, poison, step, code):
    body = "model = DDP(Net())\n" + LOOP.format(poison=poison, step=step)
    path, hits, report = run(tmp_path, body)
    if code is None:
        assert hits == [] and report.status == "ok"
        return
    assert [f.code for f in hits] == [code]
    if code == "non-finite-parameters":  # NaN in the batch: the loss at step 2, the weights after it
        assert hits[0].severity == "error" and "before step 3" in hits[0].title
        assert "finite before step 2" in hits[0].evidence[1] and "step 2" in hits[0].evidence[2]
    else:  # the step was skipped: the parameters stayed finite
        assert hits[0].severity == "warning" and hits[0].title in ("the loss is inf at step 2",
                                                                   "the loss is nan at step 2")


META = """
with torch.device("meta"):
    model = Net()
model.to_empty(device="cpu")
{init}
model = DDP(model)
""" + LOOP.format(poison="pass", step="opt.step()")


@pytest.mark.parametrize("blocks, init, caught", [
    ("pass", "model.init_weights()", True),
    ("for b in self.blocks: b.reset_parameters()", "model.init_weights()", False),
    ("pass", "model.load_state_dict(Net().state_dict())", False)])
def test_tensors_to_empty_left_unwritten_are_named_where_their_initialisation_is_missing(
        tmp_path, blocks, init, caught):
    path, hits, report = run(tmp_path, META.format(init=init), blocks)
    hits = [f for f in hits if f.code == "parameters-never-initialised"]
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].severity == "error" and hits[0].lesson == "02"
    assert hits[0].where == f"train.py:{line_of(path, 'self.head.reset_parameters()')}: self.head.reset_parameters()"
    assert hits[0].title.startswith("4 parameter(s)") and "blocks.0.weight" in hits[0].evidence[0]
    assert f"train.py:{line_of(path, 'model.to_empty')}:" in hits[0].evidence[0]


AT_EXIT = """
model = nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(7):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    {poison}
"""


@pytest.mark.parametrize("poison, caught", [
    ("if step == 6: model.weight.data.fill_(float('nan'))", True), ("pass", False)])
def test_parameters_gone_non_finite_after_the_last_step_checked_are_found_at_exit(tmp_path, poison, caught):
    """Checked before steps 0-4 and when the script ends: the script freed its optimizer (main()
    returned), the parameters it stepped last are read all the same."""
    path, hits, report = run(tmp_path, AT_EXIT.format(poison=poison))
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert [f.code for f in hits] == ["non-finite-parameters"]
    assert any("when the script ended" in line for line in [hits[0].title, *hits[0].evidence])
