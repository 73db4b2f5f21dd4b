"""Watch check "ddp_settings", code `accumulation-syncs-every-micro-batch`
(ddp_lab/doctor/checks/_ddp_settings_accum.py): gradient accumulation on a DDP model whose every
micro-batch's backward DDP all-reduces. Real runs under watch on 2 ranks: caught on blind case
b56 (at its backward line), on a plain accumulation loop (at the loop's backward line) and, with
the reason, when no_sync() holds the backward but not the forward (DDP synchronises all the
same); quiet on b56's fixed script (no_sync for all but the last micro-batch), with nanoGPT's
`require_backward_grad_sync = last` set before the forward, when each backward has its own
optimizer step, for two losses through one backward, when the gradients are set to None between
two backwards, with a comm hook of the user's, and under static_graph=True. And the mechanism
itself, without watch: DDP's reducer counted (a comm hook) all-reducing a backward run under
no_sync() whose forward ran outside it (b51's fixed script keeps that defect: case.toml's
[second_defect])."""
import os
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir)
CASE = os.path.join(ROOT, "tests", "corpus", "watch", "b56_accum_syncs_every_micro")
CODE = "accumulation-syncs-every-micro-batch"

pytestmark = pytest.mark.slow


def _buckets_reduced(forward_inside: bool) -> list[int]:
    """On a rank: the buckets DDP's reducer all-reduced in each of 4 micro-batches, the first 3
    under no_sync() (with the forward inside it, or only the backward), the last synchronised."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, calls = DDP(nn.Linear(4, 1)), [0]

    def counted(state, bucket):  # called once per bucket the reducer all-reduces
        calls[0] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, counted)
    seen = []
    for i in range(4):
        x, before = torch.randn(2, 4), calls[0]
        if i < 3 and forward_inside:
            with model.no_sync():
                model(x).sum().backward()
        elif i < 3:
            loss = model(x).sum()
            with model.no_sync():
                loss.backward()
        else:
            model(x).sum().backward()
        seen.append(calls[0] - before)
    return seen


@pytest.mark.parametrize("inside, expected", [(True, [0, 0, 0, 1]), (False, [1, 1, 1, 1])])
def test_ddp_all_reduces_a_backward_under_no_sync_whose_forward_ran_outside_it(inside, expected):
    from ddp_lab import launch

    run = launch(_buckets_reduced, inside, world_size=2, timeout=60)
    assert run.status == "ok", run
    assert [r.value for r in run.ranks] == [expected, expected]


def run(path):
    return corpus_report(path) or watch_script(str(path), nproc=2, timeout=120,
                                               checks=["ddp_settings"])


def ours(report):
    return [f for f in report.findings if f.code == CODE]


def test_b56_accumulation_without_no_sync_is_a_warning_at_the_backward():
    report = run(os.path.join(CASE, "broken.py"))
    [f] = ours(report)
    assert (f.severity, f.lesson) == ("warning", "01")
    assert f.where == "broken.py:31: loss.backward()"
    assert f.evidence[0].startswith("in 3 of 3 optimizer steps")


def test_b56_fixed_with_no_sync_is_quiet():
    report = run(os.path.join(CASE, "fixed.py"))
    assert ours(report) == [] and report.status == "ok"
    assert [f.code for f in report.findings if f.severity != "info"] == []


SCRIPT = """
import contextlib
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

MODE = {mode!r}


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 4), static_graph=MODE == "static_graph")
    if MODE == "comm_hook":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(5):
        opt.zero_grad()
        for micro in range(4):
            last = micro == 3
            if MODE == "flag":
                model.require_backward_grad_sync = last
            quiet = MODE == "no_sync" and not last
            with model.no_sync() if quiet else contextlib.nullcontext():
                out = model(torch.randn(4, 8))
                loss = out.pow(2).mean() / 4
                if MODE == "two_losses":  # a second loss of the same forward, one backward
                    loss = loss + out.abs().mean()
                with model.no_sync() if MODE == "backward_only" and not last else contextlib.nullcontext():
                    loss.backward()  # backward_only: no_sync() around the backward alone syncs
            if MODE == "step_each":
                opt.step()
                opt.zero_grad()
            if MODE == "set_to_none":
                opt.zero_grad(set_to_none=True)
            if MODE == "two_losses":
                break
        opt.step()
    dist.destroy_process_group()


main()
"""


def script(tmp_path, mode: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT.format(mode=mode)))
    return run(path)


def test_a_plain_accumulation_loop_is_named_at_its_backward(tmp_path):
    report = script(tmp_path, "plain")
    [f] = ours(report)
    assert f.where == "train.py:30: loss.backward()  # backward_only: no_sync() around the backward alone syncs"
    assert f.evidence[0].startswith("in 5 of 5 optimizer steps")
    assert "(15 such backwards on rank 0)" in f.evidence[0]  # 3 wasted of 4, 5 steps


def test_no_sync_around_the_backward_alone_still_syncs_and_is_named(tmp_path):
    report = script(tmp_path, "backward_only")  # no_sync's docstring: the forward belongs inside
    [f] = ours(report)
    assert f.where.startswith("train.py:30: loss.backward()")
    assert f.title.startswith("gradient accumulation on a DDP model with no_sync() around the "
                              "backward but not the forward: the gradients are all-reduced")
    assert any(e.startswith("15 backward(s) ran under model.no_sync() while their forward")
               for e in f.evidence)


@pytest.mark.parametrize("mode", ["no_sync", "flag", "step_each", "two_losses", "set_to_none",
                                  "comm_hook", "static_graph"])
def test_quiet_forms(tmp_path, mode):
    report = script(tmp_path, mode)
    assert ours(report) == [] and report.status == "ok", report.text()
    recs = [r["ddp-accum"][0] for r in report.evidence.ranks]
    assert all(r["steps"] >= 5 for r in recs)  # the model was watched
    if mode in ("no_sync", "flag", "two_losses", "set_to_none"):
        assert all(r["wasted"] == 0 and r["synced_steps"] >= 5 for r in recs)  # measured
    if mode in ("comm_hook", "static_graph"):
        assert all(r["wasted_steps"] == 5 for r in recs)  # the waste is there; not judged
