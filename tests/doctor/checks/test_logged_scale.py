"""The logged check's rule on the loss backward() runs on (ddp_lab/doctor/checks/_logged_scale.py):
under a wrapper that averages, the step's backward weights must add up to one mean loss's
gradient; a loss divided by the world size (a number of the script's that equals it, or every
rank's count of terms) makes them 1/W, `loss-divided-by-world-size` at the line that divided.
Both sides: the blind case b30 (loss / (ACCUM_STEPS * world_size)) is caught at its line and its
fixed script (loss / ACCUM_STEPS, with ACCUM_STEPS == world size == 2) is quiet; fast tests hold
the judge on hand-made records and the reading of the dividing line in the core's own mode."""
import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import corpus_report
from ddp_lab.doctor.checks import _logged_judge as judging, _logged_scale as scale, logged
from ddp_lab.doctor.checks.api import Context, Evidence
from ddp_lab.doctor.watch.core import function_mode

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
B30 = CORPUS / "b30_accum_loss_world_scaled"
CODE = "loss-divided-by-world-size"


@lru_cache(maxsize=None)
def report(path: str):
    from ddp_lab.doctor.watch.script import watch_script

    return corpus_report(path) or watch_script(path, nproc=2, timeout=90, checks=["logged"])


# --- slow: real ranks ---------------------------------------------------------------------------
@pytest.mark.slow
def test_loss_divided_by_world_size_is_a_warning_at_the_dividing_line():
    rep = report(str(B30 / "broken.py"))
    hits = [f for f in rep.findings if f.code == CODE]
    assert len(hits) == 1, [(f.code, f.where) for f in rep.findings]
    f = hits[0]
    assert f.severity == "warning" and "1/2" in f.title and "world size" in f.title
    assert f.where.startswith("broken.py:51: ") and "(ACCUM_STEPS * world_size)" in f.where
    assert any("0.5 of a mean loss" in e for e in f.evidence), f.evidence


@pytest.mark.slow
def test_accumulation_alone_is_quiet():
    rep = report(str(B30 / "fixed.py"))  # loss / ACCUM_STEPS: ACCUM_STEPS == world size == 2
    assert rep.status == "ok", rep.notes
    assert not [f for f in rep.findings if f.severity in ("error", "warning")], rep.findings


GLOBAL_COUNT = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    n = 6 + 4 * rank
    x, y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
    count = torch.tensor(float(n))
    dist.all_reduce(count)
    loss = F.cross_entropy(model(x), y, reduction="sum")
    loss = loss / count{FIX}
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("fix", ["", " * dist.get_world_size()"])
def test_a_sum_divided_by_every_ranks_count(tmp_path, fix):
    """HF's num_items_in_batch route: a sum over the rank's tokens divided by all ranks' count,
    while DDP averages too (1/W); times the world size it is the one-process update."""
    script = tmp_path / "train.py"
    script.write_text(GLOBAL_COUNT.replace("{FIX}", fix))
    rep = report(str(script))
    hits = [f for f in rep.findings if f.code == CODE]
    if fix:
        assert hits == [], [(f.code, f.where) for f in hits]
    else:
        assert len(hits) == 1 and "global count" in hits[0].title, rep.findings
        assert hits[0].where.startswith("train.py:16: loss = loss / count"), hits[0].where


WRAPPERS = {
    "fsdp2": ("from torch.distributed.fsdp import fully_shard\n"
              "model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))\n"
              "fully_shard(model[0]); fully_shard(model)\n"),
    "ddp with a summing hook": (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3)))\n"
        "def summed(state, bucket):\n"
        "    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(\n"
        "        lambda f: f.value()[0])\n"
        "model.register_comm_hook(None, summed)\n"),
}
DIVIDED = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
dist.init_process_group("gloo")
world_size = dist.get_world_size()
torch.manual_seed(0)
{WRAP}opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(dist.get_rank())
for step in range(3):
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    loss = F.cross_entropy(model(x), y) / world_size
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_the_wrapper_decides(tmp_path, wrapper):
    """FSDP2 averages as DDP does: the division is a warning; a DDP whose comm hook (the user's)
    sums makes loss / world_size the one-process update: nothing."""
    script = tmp_path / "train.py"
    script.write_text(DIVIDED.replace("{WRAP}", WRAPPERS[wrapper]))
    rep = report(str(script))
    assert rep.status == "ok", rep.notes
    hits = [f for f in rep.findings if f.code == CODE]
    if wrapper == "fsdp2":
        assert len(hits) == 1 and "loss = F.cross_entropy(model(x), y) / world_size" in hits[0].where
    else:
        assert hits == [], hits


# --- fast: the judge on hand-made records ------------------------------------------------------
def step(s, *micro, by=()):
    """One rank's records of step s: (criterion mean, count, backward value) per micro-batch."""
    out = []
    for v, n, b in micro:
        out += [{"s": s, "fn": "mse_loss", "v": v, "grad": True, "red": "mean", "n": n},
                {"s": s, "fn": "backward", "v": b, "pure": True, "by": list(by)}]
    return out


WS = {"line": "train.py:12: loss = loss / (ACCUM * world_size)", "ws": True}
LITERAL = {"line": "train.py:12: loss = 0.5 * loss", "ws": False}


def judged(ranks, avg=2):
    for r in ranks:
        r["logged.wrappers"] = [{"kind": "ddp", "avg": avg}]
    return [f for f in judging.judge(Evidence(ranks, script="train.py")) if f.code == CODE]


def test_a_division_by_the_world_size_is_a_warning_and_accumulation_is_not():
    quarter = [{"logged.train": step(0, (1.0, 4, 0.25), (2.0, 4, 0.5), by=[WS])
                + step(1, (1.0, 4, 0.25), (3.0, 4, 0.75), by=[WS])} for _ in range(2)]
    found = judged(quarter)
    assert [f.where for f in found] == [WS["line"]] and "steps 0-1" in found[0].evidence[1]
    half = [{"logged.train": step(0, (1.0, 4, 0.5), (2.0, 4, 1.0), by=[WS])} for _ in range(2)]
    assert judged(half) == []  # / ACCUM with 2 micro-batches: the mass is 1
    assert judged(quarter, avg=None) == []  # a comm hook of the user's: not averaged by us


def test_a_literal_factor_is_no_world_size_and_a_right_step_clears_the_run():
    literal = [{"logged.train": step(0, (1.0, 4, 0.5), by=[LITERAL])} for _ in range(2)]
    assert judged(literal) == []  # 0.5 * loss is the same at world size 1
    full, short = [(1.0, 4, 0.25)] * 4, [(1.0, 4, 0.25)] * 2
    partial = [{"logged.train": step(0, *full, by=[WS]) + step(1, *short, by=[WS])}
               for _ in range(2)]
    assert judged(partial) == []  # / ACCUM (4): step 0 is right, step 1 a short last one
    assert len(judged([{"logged.train": step(1, *short, by=[WS])} for _ in range(2)])) == 1
    impure = [{"logged.train": [dict(e, pure=False) for e in step(0, (1.0, 4, 0.5), by=[WS])]}
              for _ in range(2)]
    assert judged(impure) == []  # backward() of something else than the loss scaled


def test_every_ranks_count_as_divisor_is_read_from_the_weights():
    def rank(n, total=16):
        return {"logged.train": [
            {"s": 0, "fn": "cross_entropy", "v": 2.0 * n, "grad": True, "red": "sum", "n": n},
            {"s": 0, "fn": "backward", "v": 2.0 * n / total, "pure": True,
             "by": [{"line": "train.py:9: loss = loss / count", "ws": False}]}]}
    found = judged([rank(6), rank(10)])
    assert len(found) == 1 and "global count" in found[0].title
    assert found[0].where == "train.py:9: loss = loss / count"
    assert judged([rank(8), rank(8)]) == []  # equal counts: 1/W is no evidence of its own
    assert judged([rank(6, total=6), rank(10, total=10)]) == []  # a sum over the rank's own count


# --- fast: the rank side in the core's own mode --------------------------------------------------
@pytest.fixture
def rank_side(monkeypatch):
    """The logged check attached to a Context whose user file is this one, and the core's mode;
    what it wrapped is put back after the test."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    ctx = Context(__file__)
    logged.attach(ctx)
    yield ctx, function_mode(ctx)
    ctx.finish()


def backwards(ctx):
    return [e for e in ctx.records["logged.train"] if e["fn"] == "backward"]


def test_the_chain_from_criterion_to_backward_and_its_lines(rank_side):
    ctx, mode = rank_side
    w = torch.ones(3, requires_grad=True)
    world_size, ACCUM = 2, 3
    with mode:
        loss = F.mse_loss(w * 2, torch.zeros(3)) / (ACCUM * world_size)
        loss.backward()
        loss = 0.5 * F.mse_loss(w, torch.zeros(3))
        loss.backward()
        loss = F.mse_loss(w, torch.zeros(3))
        loss /= int(os.environ["WORLD_SIZE"])
        loss.backward()
        (F.mse_loss(w, torch.zeros(3)) / 2).backward()
        (F.mse_loss(w, torch.zeros(3)) + w.sum()).backward()
    rows = backwards(ctx)
    assert [r.get("pure") for r in rows] == [True, True, True, True, False]
    assert [[op["ws"] for op in r.get("by", [])] for r in rows] == [[True], [False], [True],
                                                                     [False], []]
    assert "(ACCUM * world_size)" in rows[0]["by"][0]["line"]
    assert "os.environ" in rows[2]["by"][0]["line"]


def test_the_handler_is_in_the_table_only_between_criterion_and_backward(rank_side):
    ctx, mode = rank_side
    funcs = scale.scale_functions()
    w = torch.ones(3, requires_grad=True)

    def mine():
        return sum(1 for f in funcs for h in ctx._functions.get(f, [])
                   if isinstance(getattr(h, "__self__", None), scale.Scaling))
    with mode:
        assert mine() == 0
        loss = F.mse_loss(w, torch.zeros(3))
        assert mine() == len(funcs)
        loss.backward()
        assert mine() == 0
