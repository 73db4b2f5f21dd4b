"""`ddp_lab.watch` (doctor/watch/): the user's own training step on real ranks. Each check
fails on a broken step of examples/watch_train.py and passes on its fix; bad input is refused
with a WatchInputError (a ValueError) that says what to change."""
import argparse
from pathlib import Path

import pytest
import torch

from ddp_lab.doctor.loader import load_file
from ddp_lab.doctor.watch import WatchInputError, watch
from ddp_lab.doctor.watch.command import configure
from ddp_lab.instruments.deepspeed_ops import is_built

ex = load_file(str(Path(__file__).parents[2] / "examples" / "watch_train.py"))
needs_op = pytest.mark.skipif(not is_built(), reason="DeepSpeed's op is not built here: run "
                                                     "ddp-lab build-ops (ZeRO-3 on the CPU needs it)")


@pytest.fixture(scope="module")
def broken():
    return watch(ex.train_step, ex.Net, ex.batches, save=ex.save, evaluate=ex.evaluate)


@pytest.fixture(scope="module")
def fixed():
    return watch(ex.train_step_fixed, ex.seeded_net, ex.batches, save=ex.save_fixed,
                 evaluate=ex.evaluate_fixed)


@pytest.fixture(scope="module")
def zero3():
    return (watch(ex.train_step_logs_norm, ex.seeded_net, ex.batches, strategy="zero3",
                  save=ex.save_module),
            watch(ex.train_step_logs_norm_fixed, ex.seeded_net, ex.batches, strategy="zero3",
                  save=ex.save_fixed))


def _one(report, code):
    found = [f for f in report.findings if f.code == code]
    assert len(found) == 1, report.text()
    return found[0]


def test_fixed_step_has_no_finding(fixed):
    assert fixed.findings == [] and fixed.status == "ok", fixed.text()


def test_1_a_buffer_ddp_overwrites_at_the_next_forward_is_not_flagged(broken):
    # Net keeps a statistic of each rank's own batch in a buffer; DDP broadcasts rank 0's buffers
    # at every forward (broadcast_buffers=True, nn/parallel/distributed.py:1781), so the ranks
    # agree again at the next step: the shared state check flags it only with the broadcast off
    # (tests/doctor/checks/test_state.py).
    assert "buffers-differ-after-step" not in broken.codes()


def _edits_a_weight_on_rank_0(model, batch, step, optimizer=None):
    import torch.distributed as dist

    loss = ex.train_step_fixed(model, batch, step, optimizer)
    if dist.get_rank() == 0:  # e.g. a clamp or a re-init "only where we log"
        with torch.no_grad():
            model.module.out.weight.clamp_(-0.01, 0.01)
    return loss


def test_1_a_parameter_one_rank_edits_after_the_step_is_an_error():
    report = watch(_edits_a_weight_on_rank_0, ex.seeded_net, ex.batches, steps=2)
    f = _one(report, "parameters-differ-after-step")
    assert f.severity == "error" and "after step" in f.title, report.text()
    assert "out.weight" in f.evidence[0] and "before DDP(...)" in f.fix
    assert f.where.startswith("test_watch.py:")
    assert f.where.endswith(": model.module.out.weight.clamp_(-0.01, 0.01)"), f.where


def test_2_dropout_from_equal_generators_is_found(broken):
    f = _one(broken, "dropout-masks-identical-across-ranks")
    assert f.evidence[0] == "identical masks on all 2 ranks: drop"


def test_2_weights_built_from_per_rank_seeds_are_found_under_fsdp2():
    broken = watch(ex.train_step_fixed, ex.per_rank_seeded_net, ex.batches, strategy="fsdp2")
    f = _one(broken, "initial-weights-differ")
    assert f.evidence[0].startswith("differ: parameter inp.weight") and f.strategies == ("fsdp2",)
    fixed = watch(ex.train_step_fixed, ex.seeded_net, ex.batches, strategy="fsdp2")
    assert fixed.findings == [], fixed.text()
    under_ddp = watch(ex.train_step_fixed, ex.per_rank_seeded_net, ex.batches)
    assert under_ddp.findings == [], under_ddp.text()  # DDP broadcasts rank 0's weights


def test_3_a_step_one_rank_skips_parts_the_collectives(fixed):
    skips = watch(ex.train_step_skips, ex.seeded_net, ex.batches, timeout=20)
    f = _one(skips, "collectives-differ-between-ranks")
    assert f.where.startswith("watch_train.py:") and " in step " in f.evidence[0], f.evidence
    assert "collectives-differ-between-ranks" not in fixed.codes()


@needs_op
def test_4_a_zero3_placeholder_read_outside_forward_is_named_by_its_line(zero3):
    broken, fixed = zero3
    f = _one(broken, "sharded-read-outside-forward")
    assert f.severity == "error" and f.strategies == ("zero3",)
    assert "out.weight, rank 0, step 0: a ZeRO-3 placeholder of shape (0,)" in f.evidence[0]
    assert "train_step_logs_norm" in f.evidence[0]
    assert "sharded-read-outside-forward" not in fixed.codes()


def test_4_a_dtensor_read_outside_forward_under_fsdp2_is_a_note_with_its_line():
    report = watch(ex.train_step_logs_norm, ex.seeded_net, ex.batches, strategy="fsdp2")
    f = _one(report, "sharded-read-outside-forward")
    assert f.severity == "info" and "out.weight, rank 0, step 0: a DTensor" in f.evidence[0]
    assert "train_step_logs_norm" in f.evidence[0] and report.errors == []
    # The fix reads the whole weight (full_tensor): no finding. A DTensor's own norm would not do:
    # it is _NormPartial, and .item() gives this rank's shard's norm.
    fixed = watch(ex.train_step_logs_norm_fixed, ex.seeded_net, ex.batches, strategy="fsdp2")
    assert fixed.findings == [] and fixed.status == "ok", fixed.text()


def test_5_a_checkpoint_saved_through_ddp_does_not_reload(broken):
    f = _one(broken, "checkpoint-does-not-reload")
    assert 'Unexpected key(s) in state_dict: "module.' in f.evidence[0]


@needs_op
def test_5_a_checkpoint_of_zero3_placeholders_does_not_reload(zero3):
    broken, fixed = zero3
    f = _one(broken, "checkpoint-does-not-reload")
    assert "torch.Size([0])" in f.evidence[0]
    assert fixed.findings == [], fixed.text()


def test_6_a_loss_returned_from_one_ranks_data_is_a_note_with_its_line(broken):
    # What most training loops do, knowingly: a note, never a warning (issue 35).
    f = _one(broken, "logged-value-one-rank")
    assert f.severity == "info" and f.evidence[0].startswith("rank 0 logs ")
    assert f.where.startswith("watch_train.py:") and "return" in f.where, f.where


def test_an_evaluation_of_each_ranks_own_data_is_found(broken):
    f = _one(broken, "evaluation-differs-between-ranks")
    assert f.evidence[0].startswith("mae: rank 0 ")


def test_a_step_that_does_not_fit_is_refused_before_any_launch():
    with pytest.raises(WatchInputError, match=r"train_step must take \(model, batch, step\)"):
        watch(lambda model, batch: 0.0, ex.Net, ex.batches)
    with pytest.raises(WatchInputError, match="strategy must be one of ddp, fsdp2, zero3"):
        watch(ex.train_step, ex.Net, ex.batches, strategy="zero2")
    assert issubclass(WatchInputError, ValueError)


def _returns_nothing(model, batch, step):
    model(batch[0]).sum().backward()


def test_a_step_that_returns_nothing_is_refused():
    with pytest.raises(WatchInputError, match="rank 0: train_step returned None at step 0"):
        watch(_returns_nothing, ex.Net, ex.batches, steps=1)
    with pytest.raises(WatchInputError, match="rank 0: evaluate returned None at step 1"):
        watch(ex.train_step_fixed, ex.Net, ex.batches, steps=1, evaluate=lambda model, batch: None)


def _logs_lr(model, batch, step, optimizer=None):
    ex.train_step_fixed(model, batch, step, optimizer)
    return {"lr": 0.05}  # not the loss: nothing to compare with the all-rank loss


def _saves_with_the_step(model, path):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        torch.save({"state_dict": model.module.state_dict(), "step": 3}, path)


def test_a_returned_value_that_is_not_the_loss_and_a_checkpoint_of_parts_are_fine():
    report = watch(_logs_lr, ex.seeded_net, ex.batches, steps=2, save=_saves_with_the_step)
    assert report.findings == [] and report.status == "ok", report.text()


def test_cli_takes_the_step_the_model_and_the_strategy():
    parser = configure(argparse.ArgumentParser())
    args = parser.parse_args(["t.py:train_step", "--model", "t.py:Net", "--strategy", "zero3"])
    args = parser.parse_args([*args.script_args, args.target], namespace=args)  # as run() does
    assert (args.target, args.model, args.strategy, args.batches) == (
        "t.py:train_step", "t.py:Net", "zero3", "batches")


def test_cli_runs_the_readme_example(monkeypatch, capsys):
    from ddp_lab.cli import main

    monkeypatch.chdir(Path(__file__).parents[2])
    code = main(["watch", "examples/watch_train.py:train_step", "--model",
                 "examples/watch_train.py:Net", "--save", "save", "--evaluate", "evaluate"])
    out = capsys.readouterr().out
    assert code == 0 and "checkpoint-does-not-reload" in out and "dropout-masks-identical" in out
    assert "evaluation-differs-between-ranks" in out
    assert main(["watch", "examples/watch_train.py:Net", "--model", "examples/watch_train.py:Net"]) == 2
    assert "train_step must take (model, batch, step)" in capsys.readouterr().err


def test_a_step_that_requires_the_optimizer_fits():
    from ddp_lab.doctor.watch import _validate

    def step(model, batch, step, optimizer):
        return 0.0

    _validate(step, ex.Net, ex.batches, "ddp", 3, 2, None)  # no WatchInputError
