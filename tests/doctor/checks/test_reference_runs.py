"""`ddp-lab watch --reference` on real ranks (ddp_lab/doctor/watch/reference_run.py and
checks/reference.py): the script unchanged at world size 2, then as one process on the same global
batch. Caught at the first parting step and tensor, with the line: the loss divided by the world
size before backward (every gradient 0.50x), the blind cases b04 (the learning rate sized from the
per-rank --batch-size), b32 (contrastive negatives from the rank's own batch) and b33 (advantages
normalised per rank), each fixed script quiet; under Adam the same division is an info
(reference-gradient-only: Adam scales it away); BatchNorm without SyncBatchNorm is explained;
scripts the reference cannot serve (batches made in the loop, a script that refuses world size 1)
get a note, never a finding; examples/scripts/train_ddp.py is compared and quiet; FSDP2's shards
are put together and compared (quiet, and the divided loss caught); dropout inside a compiled
model is explained; lesson 20's
script with a declared global batch of 16 (reference-global-batch: its per-rank --batch-size 16
trains on 32 a step at 2 ranks) and quiet with the batch divided by the world size."""
from functools import lru_cache
from pathlib import Path

import pytest

from conftest import corpus_report
from ddp_lab.doctor.watch.script import watch_script

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[3]
CORPUS = ROOT / "tests" / "corpus" / "watch"
LOUD = ("error", "warning")

SCRIPT = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("gloo")
world = dist.get_world_size()
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 6, generator=g)
data = TensorDataset(x, x @ torch.ones(6, 1))
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(6, 16), {NORM}nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.{OPT}(model.parameters(), lr=0.01)
sampler = DistributedSampler(data, seed=0)
loader = DataLoader(data, batch_size=8, sampler=sampler)
for xb, yb in loader:
    loss = F.mse_loss(model(xb), yb){DIVIDE}
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
'''


@lru_cache(maxsize=None)
def _run(path: str, steps: int = 3):
    return corpus_report(path) or watch_script(path, nproc=2, timeout=120, reference=steps)


def _script(tmp_path, name="train.py", **knobs):
    text = SCRIPT
    for key, default in (("NORM", ""), ("OPT", "SGD"), ("DIVIDE", "")):
        text = text.replace("{" + key + "}", knobs.get(key, default))
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _ours(report):
    return [f for f in report.findings if f.code.startswith("reference-")]


def _loud(report):
    return [(f.code, f.title) for f in report.findings if f.severity in LOUD]


def test_loss_divided_by_the_world_size_parts_at_step_0_at_the_dividing_line(tmp_path):
    rep = _run(_script(tmp_path, DIVIDE=" / world"))
    found = _ours(rep)
    assert [(f.severity, f.code) for f in found] == [("warning", "reference-differs")], found
    f = found[0]
    assert "every gradient is 0.50x one process's, every update 0.50x" in f.title
    assert f.where.startswith("train.py:17: ") and "/ world" in f.where
    assert f.evidence[0].startswith("step 0 is the first to part, at the gradient of 0.weight")


def test_the_correct_script_is_compared_and_quiet(tmp_path):
    rep = _run(_script(tmp_path))
    assert not _ours(rep) and not _loud(rep), rep.findings
    assert any("3 step(s) compared with one process" in n for n in rep.notes), rep.notes
    assert any(n.startswith("--reference cost: one process for 3 step(s) took") for n in rep.notes)
    assert any("draws batches of 16 = 8 x 2" in n for n in rep.notes), rep.notes


def test_under_adam_the_divided_loss_is_an_info(tmp_path):
    rep = _run(_script(tmp_path, OPT="Adam", DIVIDE=" / world"))
    found = _ours(rep)
    assert [(f.severity, f.code) for f in found] == [("info", "reference-gradient-only")], found
    assert "every gradient is 0.50x" in found[0].title and "every update 1.00x" in found[0].title


def test_batchnorm_without_syncbatchnorm_is_explained(tmp_path):
    rep = _run(_script(tmp_path, NORM="nn.BatchNorm1d(16), "))
    found = _ours(rep)
    assert [(f.severity, f.code) for f in found] == [("info", "reference-explained")], found
    assert any("BatchNorm without SyncBatchNorm" in e for e in found[0].evidence)
    assert not _loud(rep), rep.findings


@pytest.mark.parametrize("case,line,title", [
    ("b04_lr_scaled_per_rank_batch", 41, "the learning rate is 0.50x one process's"),
    ("b32_contrastive_local_negatives", 50, "the loss cross_entropy is"),
    ("b33_advantage_norm_per_rank", 40, "the gradient of 0.weight differs")])
def test_the_blind_cases_of_the_class_are_caught_at_their_line(case, line, title):
    rep = _run(str(CORPUS / case / "broken.py"))
    found = [f for f in _ours(rep) if f.severity == "warning"]
    assert len(found) == 1, rep.findings
    assert found[0].where.startswith(f"broken.py:{line}:") and title in found[0].title, found[0]
    assert found[0].evidence[0].startswith("step 0 is the first to part")
    fixed = _run(str(CORPUS / case / "fixed.py"))
    assert not _ours(fixed) and not _loud(fixed), fixed.findings


def test_b04_runs_the_reference_as_a_one_process_user_would():
    rep = _run(str(CORPUS / "b04_lr_scaled_per_rank_batch" / "broken.py"))
    assert any("the reference ran with --batch-size 16 = 8 x 2" in n for n in rep.notes), rep.notes


UNSERVED = '''
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
{GUARD}
model = DDP(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 4)
    model(x).pow(2).mean().backward()
    opt.step()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("guard,why", [
    ("", "no DataLoader fed the first step on rank 0: the script makes its batches itself"),
    ("assert dist.get_world_size() > 1, 'run me on several ranks'",
     "the script did not train a step at world size 1: AssertionError: run me on several ranks")])
def test_a_script_the_reference_cannot_serve_gets_a_note(tmp_path, guard, why):
    path = tmp_path / "train.py"
    if guard:  # a DataLoader it never reaches at world size 1
        text = UNSERVED.replace("{GUARD}", guard).replace(
            "for step in range(3):\n    x = torch.randn(8, 4)",
            "from torch.utils.data import DataLoader\nfor x in DataLoader(torch.randn(24, 4), batch_size=8):")
    else:
        text = UNSERVED.replace("{GUARD}", "")
    path.write_text(text)
    rep = _run(str(path))
    assert not _ours(rep), rep.findings
    assert any(n.startswith("--reference: not compared: " + why) for n in rep.notes), rep.notes


def test_the_ddp_example_is_compared_and_quiet():
    rep = _run(str(ROOT / "examples" / "scripts" / "train_ddp.py"))
    assert not _ours(rep) and not _loud(rep), rep.findings
    assert any("step(s) compared with one process" in n for n in rep.notes), rep.notes


LESSON20 = str(ROOT / "examples" / "lesson20_per_rank_batch.py")


@pytest.mark.parametrize("args", [(), ("--global",)])
def test_lesson20_a_declared_global_batch_is_held_against_the_ranks(args):
    rep = watch_script(LESSON20, list(args), nproc=2, timeout=120, reference=3, global_batch=16)
    found = [(f.severity, f.code, f.where) for f in _ours(rep)]
    if args:
        assert found == [] and not _loud(rep), rep.findings
        return
    assert found == [("warning", "reference-global-batch",
                      "lesson20_per_rank_batch.py:30: loader = DataLoader(data, batch_size=per_rank, "
                      "sampler=sampler)")], rep.findings
    f = _ours(rep)[0]
    assert f.title == "the ranks train on 32 samples a step, not the global batch of 16"
    assert f.evidence[0] == "step 0: 16 + 16 samples on the 2 ranks"


FSDP2 = '''
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 1))
fully_shard(model[0])
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(0)
x = torch.randn(64, 8, generator=g)
data = TensorDataset(x, x[:, :1])
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, seed=0))
for xb, yb in loader:
    loss = nn.functional.mse_loss(model(xb), yb){DIVIDE}
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("divide", ["", " / world"])
def test_fsdp2_shards_are_put_together_and_compared(tmp_path, divide):
    path = tmp_path / "train_fsdp2.py"
    path.write_text(FSDP2.replace("{DIVIDE}", divide))
    rep = _run(str(path))
    found = [(f.severity, f.code) for f in _ours(rep)]
    assert any("3 step(s) compared with one process" in n for n in rep.notes), rep.notes
    if not divide:
        assert found == [] and not _loud(rep), rep.findings
        return
    assert found == [("warning", "reference-differs")], rep.findings
    f = _ours(rep)[0]
    assert "every gradient is 0.50x" in f.title and f.where.startswith("train_fsdp2.py:19: ")


def test_dropout_inside_a_compiled_model_is_explained(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT.replace("{NORM}", "nn.Dropout(0.1), ").replace("{OPT}", "SGD").replace(
        "{DIVIDE}", "").replace("model = DDP(", "model = torch.compile(DDP(").replace(
        "nn.Linear(16, 1)))", "nn.Linear(16, 1))), backend=\"aot_eager\")"))
    rep = _run(str(path))
    found = _ours(rep)
    assert [(f.severity, f.code) for f in found] == [("info", "reference-explained")], rep.findings
    assert any("dropout in a compiled model" in e for e in found[0].evidence), found[0].evidence
    assert not _loud(rep), rep.findings
