"""The logged check's rule on all_gather'ed rows (ddp_lab/doctor/checks/_logged_padding.py): a
reduction over gathered parts padded to the largest rank's size must equal the same reduction
over the rows the ranks hold; `gathered-padding-counted` names the line that joined the parts
whole. Both sides on real ranks (the blind case b11 and its fix; a script gathering into one
tensor, with and without a mask), and fast tests of the rows followed in the core's own mode."""
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from conftest import corpus_report
from ddp_lab.doctor.checks import _logged_padding as padding, logged
from ddp_lab.doctor.checks.api import Context, Evidence
from ddp_lab.doctor.watch.core import function_mode

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
B11 = CORPUS / "b11_padded_gather_accuracy"
CODE = "gathered-padding-counted"


@lru_cache(maxsize=None)
def report(path: str):
    from ddp_lab.doctor.watch.script import watch_script

    return corpus_report(path) or watch_script(path, nproc=2, timeout=90, checks=["logged"])


# --- slow: real ranks ---------------------------------------------------------------------------
@pytest.mark.slow
def test_padded_parts_joined_whole_are_a_warning_at_the_join():
    rep = report(str(B11 / "broken.py"))
    hits = [f for f in rep.findings if f.code == CODE]
    assert len(hits) == 1, [(f.code, f.where) for f in rep.findings]
    f = hits[0]
    assert f.severity == "warning" and "9 padding row(s) of 30" in f.title
    assert f.where.startswith("broken.py:34: return torch.cat(all_preds)"), f.where
    assert "sum gives 28 over all 30 rows, 19 over the 21 real ones" in f.evidence[0]


@pytest.mark.slow
def test_parts_cut_to_their_sizes_are_quiet():
    rep = report(str(B11 / "fixed.py"))
    assert rep.status == "ok" and not [f for f in rep.findings if f.code == CODE], rep.findings


INTO = '''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
scores = torch.arange(5.0 + 3 * rank)  # 5 and 8 scores
sizes = [None] * world
dist.all_gather_object(sizes, scores.shape[0])
top = max(sizes)
mine = torch.zeros(top)
mine[: scores.shape[0]] = scores
every = torch.empty(world * top)
dist.all_gather_into_tensor(every, mine)
valid = torch.cat([torch.arange(top) < n for n in sizes]).float()
mean = {MEAN}
if rank == 0:
    print(f"mean score {mean.item():.3f}")
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("mean", ["every.mean()", "(every * valid).sum() / valid.sum()"])
def test_a_gather_into_one_tensor(tmp_path, mean):
    script = tmp_path / "score.py"
    script.write_text(INTO.replace("{MEAN}", mean))
    hits = [f for f in report(str(script)).findings if f.code == CODE]
    if "valid" in mean:
        assert hits == []
    else:
        assert len(hits) == 1, hits
        assert hits[0].where.startswith("score.py:12: dist.all_gather_into"), hits[0].where
        assert "3 padding row(s) of 16" in hits[0].title


# --- fast: the rows followed in the core's own mode ---------------------------------------------
@pytest.fixture
def rank_side():
    """A Context whose user file is this one, the logged check attached (what it wraps is put
    back after the test), the core's mode, and a Padding of the test's own on that Context."""
    ctx = Context(__file__)
    logged.attach(ctx)
    pad = padding.Padding(ctx, padding.padding_functions())
    yield ctx, function_mode(ctx), pad
    pad.stop()
    ctx.finish()


SIZES = [5, 3]


def parts(fill=0, sizes=SIZES, seed=0):
    """Each rank's labels padded with `fill` to the largest size, as all_gather leaves them."""
    g = torch.Generator().manual_seed(seed)
    top = max(sizes)
    out = []
    for n in sizes:
        p = torch.full((top,), fill, dtype=torch.long)
        p[:n] = torch.randint(1, 3, (n,), generator=g)
        out.append(p)
    return out


def gather(pad, *lists, sizes=SIZES):
    pad.gathered([torch.tensor([n]) for n in sizes])
    for p in lists:
        pad.gathered(p)


def recorded(ctx):
    return ctx.records.get("logged.padding", [])


def test_joined_whole_and_counted(rank_side):
    ctx, mode, pad = rank_side
    preds, labels = parts(seed=1), parts(seed=2)
    gather(pad, preds, labels)
    with mode:
        p, y = torch.cat(preds), torch.cat(labels)  # the join
        hits = (p == y).sum()
        acc = (p == y).float().mean()
    [a, b] = recorded(ctx)
    assert a["line"].startswith("test_logged_padding.py:") and "torch.cat(preds)" in a["line"]
    assert "(p == y).sum()" in a["at"] and a["pad"] == 2 and a["rows"] == 10
    assert a["v"] == float(hits) and a["v"] - a["real"] == 2  # the fills are equal: 2 hits
    assert b["fn"] == "mean" and b["real"] == pytest.approx(a["real"] / 8)
    assert acc.item() == pytest.approx((a["real"] + 2) / 10)


def test_stacked_parts_flattened(rank_side):
    ctx, mode, pad = rank_side
    preds = parts(seed=1)
    gather(pad, preds)
    with mode:
        every = torch.stack(preds).flatten()
        (every > 1).float().mean()
    [row] = recorded(ctx)
    assert "torch.stack(preds)" in row["line"] and row["pad"] == 2 and row["fn"] == "mean"


def test_cut_or_masked_rows_are_not_recorded(rank_side):
    ctx, mode, pad = rank_side
    preds, labels = parts(seed=1), parts(seed=2)
    gather(pad, preds, labels)
    with mode:
        p = torch.cat([t[:n] for t, n in zip(preds, SIZES)])
        y = torch.cat([t[:n] for t, n in zip(labels, SIZES)])
        (p == y).sum()
        valid = torch.cat([torch.arange(5) < n for n in SIZES])
        pw, yw = torch.cat(preds), torch.cat(labels)
        ((pw == yw) & valid).sum()
        (pw == yw)[valid].float().mean()
        (pw * valid).sum()
    assert recorded(ctx) == []


def test_parts_reduced_one_by_one_name_the_reduction(rank_side):
    ctx, mode, pad = rank_side
    preds, labels = parts(seed=1), parts(seed=2)
    gather(pad, preds, labels)
    with mode:
        total = sum(int((p == y).sum()) for p, y in zip(preds, labels))
    rows = recorded(ctx)
    assert len(rows) == 1 and rows[0]["line"] == rows[0]["at"] and "(p == y).sum()" in rows[0]["at"]
    assert total > 0


def test_no_padding_to_follow(rank_side):
    ctx, mode, pad = rank_side
    front = [torch.tensor([0, 0, 1, 2, 1]), torch.tensor([2, 1, 2, 1, 2])]  # no tail fill
    gather(pad, front)
    assert not pad.on
    gather(pad, parts(sizes=[4, 4]), sizes=[4, 4])  # one size: nothing was padded
    assert not pad.on
    gather(pad, parts(seed=1))
    assert pad.on
    pad.stop()  # the step's end
    assert not pad.on and not any(pad.handler in hs for hs in ctx._functions.values())
    with mode:
        torch.cat(parts(seed=1)).sum()
    assert recorded(ctx) == []


def test_the_judge_names_the_join_once():
    row = {"s": 8, "line": "train.py:34: return torch.cat(all_preds)", "fn": "sum", "pad": 9,
           "at": "train.py:67: c = x.sum()", "rows": 30, "v": 28.0, "real": 19.0}
    ranks = [{"logged.padding": [row, dict(row, at="train.py:68: m = x.mean()")]},
             {"logged.padding": [row]}]
    found = padding.judge_padding(Evidence(ranks, script="train.py"))
    assert [(f.code, f.severity, f.where) for f in found] == [(CODE, "warning", row["line"])]
    assert "28 over all 30 rows, 19 over the 21 real ones" in found[0].evidence[0]
