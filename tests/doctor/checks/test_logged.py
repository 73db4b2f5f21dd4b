"""The logged check (ddp_lab/doctor/checks/logged.py): a logged value equal to a known wrong formula
of its global value is a warning at the line that logged it, on the corpus cases' broken scripts
(each run under watch on 2 real ranks); their fixed scripts get nothing; a rank logging its own
loss is a note. Fast tests hold the formulas and the line reading on hand-made records.

    logged-value-not-global  40 (unweighted mean over ranks, ignore_index padding), 41 (SUM not
                             divided), 42 (accumulation: 1/k), 43 (last micro-batch), 44 (FSDP2
                             shard's gradient norm), 45 (accuracy: mean of rank fractions)
    logged-value-one-rank    a script where each rank prints its own loss (a note, never a warning);
                             a rank's own last micro-batch is a note unless the script all_reduces
                             that step's loss itself (43 stays a warning; b04's and b30's fixed
                             scripts print their own and get a note)
Blind b13 (a mean of the ranks' validation means, sums over files of 38 and 10 samples) is caught
at its logging line. The check's other codes have their own files: test_logged_scale.py
(loss-divided-by-world-size) and test_logged_padding.py (gathered-padding-counted).
"""
import math
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from ddp_lab.doctor.checks import _logged_judge as judging, logged
from ddp_lab.doctor.checks.api import Evidence
from conftest import corpus_report

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
CASES = ["40_loss_mean_over_ranks_ignore_index", "41_loss_allreduce_sum_not_divided",
         "42_accumulation_loss_logged_scaled", "43_accumulation_last_microbatch_logged",
         "44_fsdp2_grad_norm_local_shard", "45_accuracy_mean_of_rank_fractions"]
REASONS = dict(zip(CASES, ("unweighted mean over ranks", "SUM of the ranks", "divided by the number",
                           "last micro-batch", "local shard", "unweighted mean of the ranks' fractions")))


@lru_cache(maxsize=None)
def report(path: str):
    from ddp_lab.doctor.watch.script import watch_script

    return corpus_report(path) or watch_script(path, nproc=2, timeout=90, checks=["logged"])


def fault(case: str) -> tuple[int, str]:
    text = tomllib.loads((CORPUS / case / "case.toml").read_text())["fault"]
    lines = (CORPUS / case / "broken.py").read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, (case, text, found)
    return found[0], text


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_broken_script_warns_at_the_logging_line(case):
    rep = report(str(CORPUS / case / "broken.py"))
    hits = [f for f in rep.findings if f.code == "logged-value-not-global"]
    assert len(hits) == 1, [(f.code, f.where, f.evidence) for f in rep.findings] + rep.notes
    f = hits[0]
    line, text = fault(case)
    assert f.severity == "warning" and f.lesson == "14"
    assert f.where.startswith(f"broken.py:{line}: ") and text in f.where, f.where
    assert REASONS[case] in f.title, f.title
    assert f.evidence and f.fix


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_fixed_script_gets_no_finding(case):
    rep = report(str(CORPUS / case / "fixed.py"))
    assert rep.status == "ok", rep.notes
    mine = [f for f in rep.findings if f.code in logged.CHECK.codes]  # others' notes may come
    assert not mine, [(f.code, f.where, f.evidence) for f in mine]
    assert not [n for n in rep.notes if "hook failed" in n or "failed on this run" in n], rep.notes


BLIND = {"b13_val_loss_mean_of_means":
         'print(f"epoch {epoch} val loss {val_loss.item():.6f}")'}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BLIND))
def test_blind_mean_of_means_warns_and_its_fix_is_quiet(case):
    """b13 (blind): the mean of the ranks' validation means over 38 and 10 samples. The finding
    names the logging line; the case's fault is the division by the world size two lines above
    (`val_loss /= world_size`): cases 40-45 name the logging line for the same formula."""
    rep = report(str(CORPUS / case / "broken.py"))
    hits = [f for f in rep.findings if f.code == "logged-value-not-global"]
    assert len(hits) == 1 and "unweighted" in hits[0].title, rep.findings
    assert BLIND[case] in hits[0].where
    fixed = report(str(CORPUS / case / "fixed.py"))
    assert not [f for f in fixed.findings if f.code in logged.CHECK.codes], fixed.findings


OWN_LOSS = '''
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(4, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(3):
    x, y = torch.randn(6 + 4 * rank, 4, generator=g), torch.randint(0, 3, (6 + 4 * rank,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"rank {rank} step {step} loss {loss.item():.4f}")
dist.destroy_process_group()
'''


@pytest.mark.slow
def test_rank_logging_its_own_loss_is_a_note(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(OWN_LOSS)
    rep = report(str(script))
    assert [f.code for f in rep.findings] == ["logged-value-one-rank"], rep.findings
    f = rep.findings[0]
    assert f.severity == "info"
    assert f.where.startswith("train.py:16: ") and "loss.item()" in f.where, f.where


# --- fast: the formulas on hand-made records --------------------------------------------------
def train(step, *micro, k=None):
    """Records of one rank's step: (loss, count) per micro-batch, backward of loss / k."""
    k = k or 1
    out = []
    for v, n in micro:
        out += [{"s": step, "fn": "cross_entropy", "v": v, "grad": True, "red": "mean", "n": n},
                {"s": step, "fn": "backward", "v": v / k}]
    return out


def judged(ranks):
    return judging.judge(Evidence(ranks, script="train.py"))


def value(step, v, line="train.py:9: print(x.item())"):
    return {"s": step, "v": [v], "line": line}


def test_weighted_mean_is_true_and_unweighted_is_a_warning():
    t = (1.0 * 10 + 2.0 * 30) / 40
    ranks = [{"logged.train": train(0, (1.0, 10))}, {"logged.train": train(0, (2.0, 30))}]
    assert judged([dict(r, **{"logged.value": [value(1, t)]}) for r in ranks]) == []
    found = judged([dict(r, **{"logged.value": [value(1, 1.5)]}) for r in ranks])
    assert [(f.code, f.severity) for f in found] == [("logged-value-not-global", "warning")]
    assert "unweighted" in found[0].title and found[0].where == "train.py:9: print(x.item())"


def test_equal_counts_make_the_plain_mean_true():
    ranks = [{"logged.train": train(0, (1.0, 8)), "logged.value": [value(0, 1.5)]},
             {"logged.train": train(0, (2.0, 8)), "logged.value": [value(0, 1.5)]}]
    assert judged(ranks) == []


def test_own_loss_is_a_note_and_unknown_values_are_nothing():
    ranks = [{"logged.train": train(0, (1.0, 10)), "logged.value": [value(0, 1.0)]},
             {"logged.train": train(0, (2.0, 30)), "logged.value": [value(0, 7.25)]}]
    assert [(f.code, f.severity) for f in judged(ranks)] == [("logged-value-one-rank", "info")]


def test_accumulation_one_kth_and_last_micro_batch():
    a = {"logged.train": train(0, (1.0, 8), (3.0, 8), k=2)}
    b = {"logged.train": train(0, (2.0, 8), (4.0, 8), k=2)}
    t = 2.5
    for v, why in ((t / 2, "divided by the number"), (3.5, "last micro-batch")):
        found = judged([dict(a, **{"logged.value": [value(0, v)]}), b])
        assert [f.code for f in found] == ["logged-value-not-global"] and why in found[0].title, v
    assert judged([dict(a, **{"logged.value": [value(0, t)]}), b]) == []


def test_a_ranks_own_last_micro_batch_is_wrong_only_where_the_script_claims_a_global_loss():
    """nanoGPT's `loss.item() * accum` on rank 0 is its own number (a note); a script that
    all_reduces the step's loss itself and logs that number instead shows the wrong one."""
    a = {"logged.train": train(0, (1.0, 8), (3.0, 8), k=2), "logged.value": [value(0, 3.0)]}
    b = {"logged.train": train(0, (2.0, 8), (4.0, 8), k=2), "logged.value": []}
    found = judged([a, b])
    assert [(f.code, f.severity) for f in found] == [("logged-value-one-rank", "info")]
    assert "last micro-batch" in found[0].title
    for r, rank in enumerate((a, b)):  # loss_accum = sum of loss / k, all_reduced after step()
        rank["logged.reduce"] = [{"s": 1, "i": 1, "op": "RedOpType.SUM", "before": [2.0 + r],
                                  "after": None, "rows": 0, "line": ""}]
    found = judged([a, b])
    assert [(f.code, f.severity) for f in found] == [("logged-value-not-global", "warning")]
    assert "last micro-batch" in found[0].title
    a["logged.reduce"][0]["before"] = [9.5]  # a reduce of something else claims nothing
    assert [f.severity for f in judged([a, b])] == ["info"]


def test_evaluation_losses_weighted_by_their_counts():
    def ev(*batches):
        return [{"s": 3, "fn": "cross_entropy", "v": v, "grad": False, "red": "mean", "n": n}
                for v, n in batches]
    a, b = ev((1.0, 8), (1.0, 8), (3.0, 4)), ev((2.0, 8))
    true, own_a = (8 + 8 + 12 + 16) / 28, 28 / 20
    assert judged([{"logged.train": a, "logged.value": [value(3, true)]},
                   {"logged.train": b, "logged.value": []}]) == []
    found = judged([{"logged.train": a, "logged.value": [value(3, (own_a + 2.0) / 2)]},
                    {"logged.train": b, "logged.value": []}])
    assert [(f.code, f.severity) for f in found] == [("logged-value-not-global", "warning")]


def test_evaluation_sums_are_means_over_their_counts():
    """b13's shape: each rank sums its losses (reduction="sum") over files of different sizes,
    divides by its own count, and the ranks' means are averaged unweighted."""
    def ev(*batches):
        return [{"s": 5, "fn": "mse_loss", "v": v, "grad": False, "red": "sum", "n": n}
                for v, n in batches]
    a, b = ev((30.0, 30), (16.0, 8)), ev((50.0, 10))
    own_a, own_b, true = 46 / 38, 5.0, 96 / 48
    assert judged([{"logged.train": a, "logged.value": [value(5, true)]},
                   {"logged.train": b, "logged.value": []}]) == []
    found = judged([{"logged.train": a, "logged.value": [value(5, (own_a + own_b) / 2)]},
                    {"logged.train": b, "logged.value": []}])
    assert [(f.code, f.severity) for f in found] == [("logged-value-not-global", "warning")]
    assert "unweighted" in found[0].title and "38 terms" in found[0].evidence[1]


def test_a_line_logging_each_micro_batch_is_not_the_last_micro_batch_bug():
    a = {"logged.train": train(0, (1.0, 8), (3.0, 8), k=2),
         "logged.value": [value(0, 1.0), value(0, 3.0)]}
    b = {"logged.train": train(0, (2.0, 8), (4.0, 8), k=2), "logged.value": []}
    assert [f.severity for f in judged([a, b])] in ([], ["info"])


def test_a_step_with_two_losses_per_backward_is_not_judged():
    two = [{"s": 0, "fn": "mse_loss", "v": 0.5, "grad": True, "red": "mean", "n": 4}]
    ranks = [{"logged.train": two + train(0, (1.0, 10)), "logged.value": [value(0, 1.5)]},
             {"logged.train": train(0, (2.0, 30)), "logged.value": [value(0, 1.5)]}]
    assert judged(ranks) == []


def test_a_line_that_once_logs_the_true_value_is_never_flagged():
    t = (1.0 * 10 + 2.0 * 30) / 40
    ranks = [{"logged.train": train(0, (1.0, 10)) + train(1, (1.0, 30)),
              "logged.value": [value(0, 1.5), value(1, 1.5)]},
             {"logged.train": train(0, (2.0, 30)) + train(1, (2.0, 10)), "logged.value": []}]
    t1 = (1.0 * 30 + 2.0 * 10) / 40
    assert t1 != 1.5 and t != 1.5
    assert judged(ranks)  # both steps unweighted: flagged
    ranks[0]["logged.value"][1] = value(1, t1)
    assert judged(ranks) == []


# --- fast: which conversions are logged, and what number the log shows ------------------------
class Ctx:
    step = 0

    def __init__(self):
        self.records = {}

    def add(self, key, item):
        self.records.setdefault(key, []).append(item)

    def is_user_file(self, name):
        return name == __file__

    def user_line(self, frame=None):
        return f"line {frame.f_lineno}"


MODE = """
class Numbers(TorchFunctionMode):
    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.item, torch.Tensor.__format__, torch.Tensor.__float__):
            logged._on_number(self.ctx, func, args, out)
        return out


def library_metric(t):
    return t.item() + 1  # an item() inside a library: not what the logging line shows
"""
# The core's mode in small, compiled under another file name: as in a real run, the handler is
# called from frames outside the user's file, and the user's frame is the test's.
SPACE = {"TorchFunctionMode": TorchFunctionMode, "torch": torch, "logged": logged}
exec(compile(MODE, "<the core's mode>", "exec"), SPACE)
Numbers, library_metric = SPACE["Numbers"], SPACE["library_metric"]


def test_only_numbers_a_logging_call_shows_are_recorded(capsys):
    ctx, t, world = Ctx(), torch.tensor(3.0), 2
    with Numbers(ctx):
        x = t.item()  # not logged here: whatever happens to x later is not seen
        print(f"loss {t.item() / world:.3f} {t:.2f}", float(t) * 2)
        if t.item() > 1:
            pass
        print("loss %.3f" % t.item(), round(t.item() + 1, 2), library_metric(t))
        print(math.log(t.item()))  # math.log is no logger: the number shown is not t
    capsys.readouterr()
    assert x == 3.0
    got = [e["v"][0] for e in ctx.records["logged.value"]]
    assert got == [1.5, 3.0, 6.0, 3.0], got


def test_counts_are_what_the_mean_reduction_divides_by():
    import torch.nn.functional as F

    x, y = torch.randn(5, 3), torch.tensor([0, 2, -100, 1, 2])
    w = torch.tensor([1.0, 2.0, 0.5])
    for kwargs, n in (({}, 4.0), ({"weight": w}, 1.0 + 0.5 + 2.0 + 0.5),
                      ({"weight": w, "label_smoothing": 0.1}, 4.0)):
        b = {"input": x, "target": y, "ignore_index": -100, **kwargs}
        n = logged._count("cross_entropy", b) if "label_smoothing" in kwargs else n
        assert logged._count("cross_entropy", b) == n
        total = F.cross_entropy(x, y, reduction="sum", **kwargs)
        assert torch.allclose(F.cross_entropy(x, y, **kwargs) * n, total)  # PyTorch's own divisor
    x3, y3 = torch.randn(2, 3, 5), torch.tensor([[0, 1, -100, 2, 2], [-100, -100, 1, 0, 1]])
    assert logged._count("cross_entropy", {"input": x3, "target": y3}) == 7.0
    assert torch.allclose(F.cross_entropy(x3, y3) * 7, F.cross_entropy(x3, y3, reduction="sum"))
    probs = torch.softmax(torch.randn(5, 3), dim=1)
    assert logged._count("cross_entropy", {"input": x, "target": probs}) == 5.0
    assert logged._count("mse_loss", {"input": torch.randn(4, 1), "target": torch.randn(4, 3)}) == 12.0


def test_fractions_of_different_sample_counts_averaged_unweighted():
    def reduce_(before, rows, op):
        return {"s": 2, "i": 1, "op": op, "before": [before], "after": None, "rows": rows,
                "line": ""}
    for op in ("RedOpType.SUM", "RedOpType.AVG"):
        ranks = [{"logged.reduce": [reduce_(0.8, 20, op)], "logged.value": [value(2, 75.0)]},
                 {"logged.reduce": [reduce_(0.7, 10, op)], "logged.value": []}]
        found = judged(ranks)  # 75.0: the unweighted mean, as a percentage
        assert [(f.code, f.severity) for f in found] == [("logged-value-not-global", "warning")]
        ranks[0]["logged.value"] = [value(2, (16 + 7) / 30)]
        assert judged(ranks) == []
    # fractions that are no count over the rows seen (0.123 x 20 is no integer): not a metric
    ranks = [{"logged.reduce": [reduce_(0.123, 20, "RedOpType.SUM")],
              "logged.value": [value(2, (0.123 + 0.7) / 2)]},
             {"logged.reduce": [reduce_(0.7, 10, "RedOpType.SUM")], "logged.value": []}]
    assert judged(ranks) == []


def test_an_epoch_mean_is_judged_over_the_steps_since_the_line_last_logged():
    a = train(0, (1.0, 10)) + train(1, (2.0, 10)) + train(2, (1.0, 10)) + train(3, (2.0, 10))
    b = train(0, (2.0, 30)) + train(1, (3.0, 30)) + train(2, (2.0, 30)) + train(3, (3.0, 30))
    true = (10 + 20 + 60 + 90) / 80  # each two-step window; no single step's value
    line = "train.py:20: print(f'epoch loss {total.item()}')"
    for epoch_loss, findings in ((true, []), ((1.5 + 2.5) / 2, ["logged-value-not-global"])):
        ranks = [{"logged.train": a, "logged.value": [value(2, epoch_loss, line),
                                                      value(4, epoch_loss, line)]},
                 {"logged.train": b, "logged.value": []}]
        assert [f.code for f in judged(ranks)] == findings, epoch_loss
        assert not any(_close_any(epoch_loss, f) for f in logged_steps(ranks))


def logged_steps(ranks):
    """Every step-level formula value: the epoch values above match none of them."""
    out = {r: {} for r in range(len(ranks))}
    judging._formulas([judging._micro(r["logged.train"]) for r in ranks], out)
    return [f[0] for r in out.values() for fs in r.values() for f in fs if f[1] != "own"]


def _close_any(v, f):
    return abs(v - f) < 1e-6
