"""watch changes nothing the script's own code does (checks/_context_hooks.py): a script that
torch.saves its whole model (the DDP-wrapped module and the plain one), pickles the model, the
DDP wrapper and its optimizer, deep-copies the model for an EMA, and reloads them with
torch.load(weights_only=False) ends as it ends under plain torchrun (exit 0, the same printed
numbers, the reloaded models' outputs equal to the live ones), with no error- or warning-level
finding, while the checks' hooks are on those modules (the script counts them)."""
import re
import subprocess
import sys
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script

pytestmark = pytest.mark.usefixtures("no_leftovers")

SCRIPT = """
import copy, os, pickle, sys
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
ema = copy.deepcopy(net)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), net.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
    model.eval()
    with torch.no_grad():
        val = F.cross_entropy(model(x), y)
    model.train()
    dist.all_reduce(val)
    if rank == 0:
        sys.stdout.write(f"step {step} loss {loss.item():.6f} val {val.item() / 2:.6f}\\n")
hooked = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in (net, model))
sys.stdout.write(f"hooks {rank} {hooked}\\n")  # one write (print writes the end apart): the ranks share torchrun's stdout
path = os.path.join(sys.argv[1], f"whole{rank}.pt")
torch.save(model.module, path)
torch.save(net, path + ".net")
torch.save(opt, path + ".opt")
torch.save(ema, path + ".ema")
blob, wrapper = pickle.dumps(net), pickle.dumps(model)
again = torch.load(path, weights_only=False)
opt2 = torch.load(path + ".opt", weights_only=False)
ema2 = torch.load(path + ".ema", weights_only=False)
x = torch.ones(3, 4)
with torch.no_grad():
    assert torch.equal(again(x), net(x)), "the reloaded model differs"
    assert torch.equal(torch.load(path + ".net", weights_only=False)(x), net(x))
    assert torch.equal(pickle.loads(blob)(x), net(x))
    assert torch.equal(ema2(x), ema(x)) and torch.equal(copy.deepcopy(net)(x), net(x))
    sys.stdout.write(f"reloaded {rank} {again(x).sum().item():.6f} {ema2(x).sum().item():.6f}\\n")
assert len(opt2.state) == len(opt.state) == 4
dist.barrier()
dist.destroy_process_group()
sys.stdout.write(f"done {rank}\\n")
"""


def test_a_script_that_pickles_its_hooked_model_ends_as_under_torchrun(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    plain, watched = tmp_path / "plain", tmp_path / "watched"
    plain.mkdir()
    watched.mkdir()
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "train.py", str(plain)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines: list = []
    report = watch_script(str(path), args=(str(watched),),
                          output=lambda rank, stream, line: lines.append(line))
    assert report.status == "ok" and report.exit_status == 0, report.text()
    assert not report.errors and not report.warnings, report.text()
    said = "\n".join(lines)
    for r in (0, 1):
        assert f"done {r}" in said and f"done {r}" in done.stdout
    hooks = [int(n) for n in re.findall(r"hooks \d (\d+)", said)]
    assert len(hooks) == 2 and min(hooks) > 0, said  # the checks' hooks were on the saved model
    assert re.findall(r"hooks \d (\d+)", done.stdout) == ["0", "0"], done.stdout

    def numbers(text):
        return sorted(re.findall(r"(?:step|reloaded) .*", text))
    assert numbers(said) == numbers(done.stdout) and len(numbers(said)) == 5, said
    assert sorted(p.name for p in watched.iterdir()) == sorted(p.name for p in plain.iterdir())
