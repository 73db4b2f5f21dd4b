"""The reference check (ddp_lab/doctor/checks/reference.py, `ddp-lab watch --reference`), fast:
the claim its global batch rests on (a DistributedSampler at world size 1 with the batch x N yields
the union of the N ranks' batches, step by step, with accumulation too), the plan the parent
makes from the watched run's DataLoaders (scale the parsed argument, else the DataLoader; refuse
what it cannot serve), and the judge on hand-made records of both runs: the first step and
tensor that part, the level (reference-differs when the updates part, reference-gradient-only
when the optimizer scales the difference away, reference-explained for BatchNorm's per-rank
statistics and the step's own random draws) and the line. The real runs are in
test_reference_runs.py."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ddp_lab.doctor.checks import _reference_data as data
from ddp_lab.doctor.checks import _reference_notes as notes
from ddp_lab.doctor.checks import reference
from ddp_lab.doctor.checks.api import Evidence
from ddp_lab.doctor.watch import reference_run as run
from ddp_lab.doctor.watch.script import WatchScriptError, watch_script


def _batches(n_rows, world, rank, batch, epoch, drop_last=False):
    ds = TensorDataset(torch.arange(n_rows))
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=3,
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return [b[0].tolist() for b in DataLoader(ds, batch_size=batch, sampler=sampler)]


@pytest.mark.parametrize("world,batch,accum", [(2, 4, 1), (4, 3, 1), (2, 4, 2), (3, 5, 2)])
@pytest.mark.parametrize("epoch", [0, 1])
def test_one_process_with_n_times_the_batch_draws_the_union_of_the_ranks_batches(world, batch, accum, epoch):
    """torch/utils/data/distributed.py: one permutation seeded seed + epoch at every world size,
    rank r takes indices[r::N]: step k (accum micro-batches) of one process with N x B is the
    ranks' step k together, while the data set divides evenly."""
    n = world * batch * accum * 4
    ranks = [_batches(n, world, r, batch, epoch) for r in range(world)]
    one = _batches(n, 1, 0, world * batch, epoch)
    for k in range(len(one) // accum):
        mine = sorted(i for b in one[k * accum:(k + 1) * accum] for i in b)
        theirs = sorted(i for r in ranks for b in r[k * accum:(k + 1) * accum] for i in b)
        assert mine == theirs, (k, mine, theirs)


def test_row_hashes_name_a_sample_by_its_bytes():
    x = torch.arange(12.0).reshape(4, 3)
    y = torch.tensor([0, 1, 0, 1])
    rows = data.row_hashes([x, y], 4)
    assert len(set(rows)) == 4
    assert data.row_hashes([x[[2, 0]], y[[2, 0]]], 2) == [rows[2], rows[0]]
    assert data.row_hashes([x, 1 - y], 4)[0] != rows[0]


def _loader(i=0, batch=8, arg=None, custom=False):
    return {"i": i, "line": "train.py:20: loader = DataLoader(ds, batch_size=8)", "batch": batch,
            "custom_batches": custom, "sampler": "DistributedSampler", "arg": arg}


def test_the_plan_scales_the_parsed_argument_else_the_dataloader():
    arg = {"dest": "batch_size", "option": "--batch-size", "value": 8, "guessed": False}
    ranks = [{"reference.loaders": [_loader(arg=arg), _loader(i=1)],
              "reference.batches": [{"s": 0, "i": 0, "n": 8}, {"s": 0, "i": 1, "n": 8}]}]
    plan, why = run.make_plan(ranks, 2, 3)
    assert not why and plan["args"] == {"batch_size": 2} and plan["loaders"] == {"1": 16}
    assert "--batch-size 16 = 8 x 2" in plan["said"][0]


def test_the_plan_refuses_what_it_cannot_serve():
    plan, why = run.make_plan([{"reference.loaders": [_loader()]}], 2, 3)
    assert not plan and "no DataLoader fed the first step" in why
    ranks = [{"reference.loaders": [_loader(custom=True)], "reference.batches": [{"s": 0, "i": 0, "n": 8}]}]
    assert "batch sampler of its own" in run.make_plan(ranks, 2, 3)[1]


def test_bad_reference_steps_are_bad_input(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(WatchScriptError, match="--reference-steps must be an integer >= 1"):
        watch_script(str(script), reference=-2)
    assert run.validate_steps(True) == run.DEFAULT_STEPS
    with pytest.raises(WatchScriptError, match="--global-batch must be an integer >= 1"):
        watch_script(str(script), global_batch=0)
    from ddp_lab.doctor.watch import WatchInputError, watch

    with pytest.raises(WatchInputError, match="serve a script"):
        watch(lambda model, batch, step: 0.0, torch.nn.Linear, lambda r, s: torch.ones(1), reference=3)


# --- the judge on hand-made records ---------------------------------------------------------------
def _rows(*names):
    return [f"{hash(n) & 0xffffffff:08x}" for n in names]


def _evidence(compare, theirs_extra=None, mine_extra=None, world=2, rows_ok=True):
    ranks = []
    for r in range(world):
        rec = {"reference.batches": [{"s": 0, "i": 0, "n": 2, "rows": _rows(f"a{r}", f"b{r}")}],
               "logged.train": []}
        rec.update((theirs_extra or {}) if r == 0 else {})
        ranks.append(rec)
    all_rows = sorted(h for r in ranks for h in r["reference.batches"][0]["rows"])
    mine = {"reference.batches": [{"s": 0, "i": 0, "n": 4, "rows": all_rows if rows_ok else _rows(*"wxyz")}],
            "reference.compare": [compare], "logged.train": []}
    mine.update(mine_extra or {})
    ev = Evidence(ranks, world_size=world)
    ev.reference = {"steps": 1, "ranks": [mine], "plan": {"said": []}, "seconds": {}}
    return ev


def _compare(g_ratio=1.0, u_ratio=1.0, lr=(0.1, 0.1), bn=()):
    rows = [[n, abs(g_ratio - 1), g_ratio, abs(u_ratio - 1), u_ratio] for n in ("0.weight", "0.bias")]
    return {"s": 0, "t": rows, "lr": [[lr[0]], [lr[1]]], "bn": list(bn), "init": 0.0}


def test_agreeing_runs_give_nothing():
    assert reference.judge(_evidence(_compare())) == []


def test_a_learning_rate_that_parts_is_a_warning_at_the_line_that_computed_it():
    made = {"reference.optimizers": [{"kind": "optimizer", "type": "SGD", "lrs": [0.05], "s": 0,
                                      "line": "train.py:30: opt = SGD(model.parameters(), lr=lr)",
                                      "lr_line": "train.py:29: lr = BASE * args.batch_size"}]}
    mine = {"reference.optimizers": [dict(made["reference.optimizers"][0], lrs=[0.1])],
            "reference.scaled": [{"dest": "batch_size", "option": "--batch-size", "from": 8, "to": 16}]}
    found = reference.judge(_evidence(_compare(u_ratio=0.5, lr=(0.05, 0.1)), made, mine))
    assert [(f.severity, f.code) for f in found] == [("warning", "reference-differs")]
    f = found[0]
    assert f.where == "train.py:29: lr = BASE * args.batch_size"
    assert "learning rate is 0.50x" in f.title and "every update is 0.50x" in f.title
    assert any("--batch-size, the per-rank batch" in e for e in f.evidence), f.evidence


def test_gradients_scaled_away_by_the_optimizer_are_an_info():
    found = reference.judge(_evidence(_compare(g_ratio=0.5, u_ratio=1.0)))
    assert [(f.severity, f.code) for f in found] == [("info", "reference-gradient-only")]
    assert "every gradient is 0.50x" in found[0].title


def test_a_gradient_all_reduced_again_names_its_line():
    reduced = {"reference.grad-reduce": [{"s": 0, "param": "0.weight", "op": "SUM",
                                          "line": "train.py:40: dist.all_reduce(p.grad)"}]}
    found = reference.judge(_evidence(_compare(g_ratio=2.0, u_ratio=2.0), reduced))
    assert [(f.severity, f.code) for f in found] == [("warning", "reference-differs")]
    assert found[0].where == "train.py:40: dist.all_reduce(p.grad)"
    assert "every gradient is 2.00x" in found[0].title


@pytest.mark.parametrize("extra,word", [
    ({}, "BatchNorm without SyncBatchNorm"),
    ({"reference.random": [{"s": 0, "fn": "randn_like", "line": "train.py:33: x + noise"}]}, "random numbers")])
def test_legitimate_per_rank_differences_are_explained(extra, word):
    compare = _compare(g_ratio=0.9, u_ratio=0.9, bn=["1"] if not extra else [])
    found = reference.judge(_evidence(compare, extra))
    assert [(f.severity, f.code) for f in found] == [("info", "reference-explained")]
    assert any(word in e for e in found[0].evidence), found[0].evidence


def test_a_gradient_near_zero_is_weighed_against_the_whole_models():
    """llms_from_scratch_ddp's control script: a last layer's bias whose gradient nearly cancels
    differs by 3e-4 of itself at step 2 (a float sum's order), a millionth of the model's."""
    c = _compare()
    c["t"] = [["0.weight", 2e-7, 1.0, 3e-7, 1.0, 1.0, 0.01], ["0.bias", 3e-4, 0.9997, 3.3e-4, 0.9997, 1e-3, 1e-5]]
    assert reference.judge(_evidence(c)) == []
    c["t"][1][5:] = [1.0, 0.01]  # the same relative difference on a gradient as large as the rest
    found = reference.judge(_evidence(c))
    assert [(f.code, f.evidence[0][:54]) for f in found] == [
        ("reference-gradient-only", "step 0 is the first to part, at the gradient of 0.bias")]


def test_steps_whose_data_differ_are_never_compared():
    ev = _evidence(_compare(g_ratio=2.0, u_ratio=2.0), rows_ok=False)
    assert reference.judge(ev) == []
    assert notes.comparable(ev, ev.reference) == ([], 0)
    assert any("not compared: the reference's first batch" in n for n in notes.notes(ev))


def test_a_refused_reference_is_a_note_never_a_finding():
    ev = Evidence([{}, {}], world_size=2)
    ev.reference = {"steps": 3, "ranks": [], "refused": "no DataLoader fed the first step"}
    assert reference.judge(ev) == []
    assert notes.notes(ev) == ["--reference: not compared: no DataLoader fed the first step"]


def test_the_tolerance_follows_the_dtype_and_the_ranks():
    ev = _evidence(_compare())
    assert notes.tolerance(ev, ev.reference)["grad"] == 1e-4
    ev.reference["ranks"][0]["reference.precision"] = [{"s": 0, "dtype": "bfloat16"}]
    assert notes.tolerance(ev, ev.reference)["grad"] == pytest.approx(4 * 7.8e-3 * 2)


def test_the_cli_refuses_reference_options_for_a_step_function(capsys, tmp_path):
    from ddp_lab.cli import main

    step = tmp_path / "train.py"
    step.write_text("def train_step(model, batch, step):\n    return 0.0\n")
    assert main(["watch", "--reference", f"{step}:train_step", "--model", "torch.nn:Linear"]) == 2
    assert "serve a script" in capsys.readouterr().err
    assert main(["watch", "--reference-steps", "0", str(step)]) == 2
    assert "--reference-steps must be an integer >= 1, got 0" in capsys.readouterr().err
