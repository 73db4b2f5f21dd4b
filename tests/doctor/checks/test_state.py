"""Watch check "state" (ddp_lab/doctor/checks/state.py): parameters and buffers identical across
ranks after the optimizer's step. Each code has a failing test (a corpus case's broken.py, or a
small script: the code at its level, on the user's line at fault) and a passing one (the fixed.py:
nothing louder than a note from this check)."""
import os
import textwrap

import pytest
import torch

from ddp_lab.doctor.checks.state import digest, due, judge
from ddp_lab.doctor.checks.api import Evidence
from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {  # case folder -> (code, severity, lesson, a unique substring of broken.py's faulty line)
    "b43_aux_loss_module_backward": ("parameters-differ-after-step", "error", "01", "cons.backward()"),
    "b44_handsync_clip_norm": ("parameters-differ-after-step", "error", "01",
                               "grad_norm = torch.nn.utils.get_total_norm"),
    "10_batchnorm_stats_not_broadcast": ("buffers-differ-after-step", "warning", "08",
                                         "model = DDP(Net(), broadcast_buffers=False)"),
    "11_rank0_load_after_wrap": ("parameters-differ-after-step", "error", "01",
                                 "model.module.load_state_dict(pretrained_state())"),
    "14_fsdp2_head_added_after_shard": ("parameters-differ-after-step", "error", "01",
                                        "model.head = nn.Linear(8, 3)"),
    "15_buffer_ema_local_batch": ("buffers-differ-after-step", "warning", "08",
                                  "self.input_mean.mul_(0.9).add_(0.1 * batch_mean)"),
}


def run(path, checks=("state", "wrapped")):
    return corpus_report(path) or watch_script(path, nproc=2, timeout=60, checks=list(checks))


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


def ours(report):
    return [f for f in report.findings if f.code in ("parameters-differ-after-step",
                                                      "buffers-differ-after-step", "state-not-compared")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_case_is_caught_on_its_line(case):
    code, severity, lesson, fault = CASES[case]
    path = os.path.join(CORPUS, case, "broken.py")
    report = run(path)
    hits = [f for f in report.findings if f.code == code]
    assert hits, [(f.code, f.severity) for f in report.findings]
    f = hits[0]
    assert (f.severity, f.lesson) == (severity, lesson)
    if fault is not None:
        assert f.where.startswith(f"broken.py:{line_of(path, fault)}: ") and fault in f.where
    assert "after step 0" in f.title  # the first step compared already differs


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_case_gives_no_warning(case):
    report = run(os.path.join(CORPUS, case, "fixed.py"))
    assert [(f.code, f.severity) for f in ours(report) if f.severity != "info"] == []
    assert report.status == "ok"
    ranks = report.evidence.ranks
    assert all(not r.get("check-errors") for r in ranks)
    if case.startswith("b"):  # a blind case: its own number of steps
        return
    assert all(len([x for x in r.get("state", []) if not x.get("exit")]) == 4 for r in ranks)  # the 4 steps
    assert all([x["step"] for x in r["state"] if x.get("exit")] == [3] for r in ranks)  # and the last at exit


def test_fully_sharded_model_is_a_note_not_a_finding():
    report = run(os.path.join(CORPUS, "14_fsdp2_head_added_after_shard", "fixed.py"))
    notes = [f for f in ours(report) if f.code == "state-not-compared"]
    assert len(notes) == 1 and notes[0].severity == "info" and "sharded" in notes[0].title


EDIT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            if {who}:
                model.module.weight.clamp_(-0.1, 0.1)  # keep the weights small
    dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize("who, caught", [("rank == 0", True), ("True", False)])
def test_an_edit_outside_the_optimizer_is_named_when_only_some_ranks_make_it(tmp_path, who, caught):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(EDIT.format(who=who)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    if not caught:  # every rank clamps the same weights: they stay equal
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].severity == "error"
    assert hits[0].where == f"train.py:{line_of(path, 'clamp_')}: model.module.weight.clamp_(-0.1, 0.1)  # keep the weights small"
    assert any("rank(s) 0 of 2 edited weight" in e for e in hits[0].evidence)


def test_the_hash_sees_one_ulp_and_the_schedule_thins_out():
    a = torch.ones(1000)
    b = a.clone()
    b[500] = torch.nextafter(b[500], torch.tensor(2.0))
    assert digest(a) == digest(a.clone()) and digest(a) != digest(b)
    assert digest(torch.ones(2, dtype=torch.bfloat16)) != digest(torch.zeros(2, dtype=torch.bfloat16))
    assert [s for s in range(40) if due(s)] == [0, 1, 2, 3, 4, 9, 19, 29, 39]


def test_judge_needs_two_ranks_and_a_difference():
    row = {"step": 0, "parameter": {"w": "1"}, "buffer": {}, "sharded": 0}
    assert judge(Evidence([{"state": [row]}])) == []
    assert judge(Evidence([{"state": [row]}, {"state": [row]}])) == []
    other = dict(row, parameter={"w": "2"})
    found = judge(Evidence([{"state": [row]}, {"state": [other]}]))
    assert [(f.code, f.severity, f.where) for f in found] == [("parameters-differ-after-step", "error", "")]


LEFT_OUT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    {root}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(2):
        x = torch.randn(16, 8, generator=gen)
        loss = nn.functional.cross_entropy(model(x), torch.randint(0, 3, (16,), generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize("root, caught", [("pass", True), ("fully_shard(model)", False)])
def test_fsdp2_module_left_out_is_named_by_the_optimizer_it_is_in(tmp_path, root, caught):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LEFT_OUT.format(root=root)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    if not caught:  # the root shards the head: nothing outside a wrapped model
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].severity == "error"
    assert hits[0].evidence[0].startswith("head.weight (in no wrapped model): rank 0 ")


def test_a_buffer_reassigned_in_forward_is_named_at_its_assignment(tmp_path):
    """pytorch#84053's form: `self.input_mean = 0.9 * self.input_mean + ...` re-registers the buffer
    (Module.__setattr__ -> register_buffer): the buffer registration hook names the line."""
    with open(os.path.join(CORPUS, "15_buffer_ema_local_batch", "broken.py")) as f:
        src = f.read()
    new = "self.input_mean = 0.9 * self.input_mean + 0.1 * x.mean(dim=0).detach()"
    src = src.replace("""with torch.no_grad():
                batch_mean = x.mean(dim=0)
                self.input_mean.mul_(0.9).add_(0.1 * batch_mean)""", new)
    path = tmp_path / "train.py"
    path.write_text(src)
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "buffers-differ-after-step"]
    assert hits and hits[0].severity == "warning"
    assert hits[0].where == f"train.py:{line_of(path, new)}: {new}"


LATE = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = {model}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        if step == 5 and {who}:
            opt.param_groups[0]["lr"] = 0.01
    dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize("model", ["DDP(nn.Linear(4, 2))", "nn.Linear(4, 2)"])
@pytest.mark.parametrize("who, caught", [("rank == 0", True), ("True", False)])
def test_a_parting_after_the_hashed_steps_is_seen_at_exit(tmp_path, who, caught, model):
    """Steps 0-4 are hashed, then every 10th: a parting at step 6 of 8 is seen in the last
    step's hash, taken when the script ends; with no wrapper (replicas that see the same data),
    the parameters the optimizer stepped last, though the script freed it when main() returned."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LATE.format(who=who, model=model)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    assert all([x["step"] for x in r["state"] if x.get("exit")] == [7] for r in report.evidence.ranks)
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and "after step 7 (hashed when the script ended; equal after step 4)" in hits[0].title


REBUILT = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(8):
        if step == 3:  # the resume: a new optimizer, loaded with the old one's state
            state = opt.state_dict()
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            opt.load_state_dict(state)
        if step == 4 and {who}:
            opt.param_groups[0]["lr"] = 0.01
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize("who, caught", [("rank == 0", True), ("True", False)])
def test_the_steps_of_a_rebuilt_optimizer_are_hashed(tmp_path, who, caught):
    """A resume that builds a new optimizer: its steps are the run's steps (the floor's step
    counter follows the newest optimizer of the same parameters), so steps 3-4 are hashed and a
    parting at step 4 is dated there, not at the script's end."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(REBUILT.format(who=who)))
    report = run(str(path), checks=("state",))
    assert all([x["step"] for x in r["state"] if not x.get("exit")] == [0, 1, 2, 3, 4]
               for r in report.evidence.ranks)
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].title.endswith("after step 4")


HAND_SYNCED = """
import torch, torch.distributed as dist, torch.nn as nn


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed({seed})
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4) + rank).pow(2).mean().backward()
        for p in model.parameters():
            {sync}
        opt.step()
    dist.destroy_process_group()


main()
"""


@pytest.mark.parametrize("seed, sync, caught", [
    ("0", "dist.all_reduce(p.grad); p.grad /= world", False),  # replicas kept in step by hand
    ("0", "pass", True),  # replicas that nothing syncs
    ("rank", "pass", False)])  # each rank its own model: not replicas, not compared
def test_parameters_no_wrapper_holds_are_compared_where_the_ranks_started_equal(tmp_path, seed, sync, caught):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(HAND_SYNCED.format(seed=seed, sync=sync)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    starts = [r.get("state-start") for r in report.evidence.ranks]
    assert all(s and set(s[0]["parameter"]) == {"weight (no wrapper)", "bias (no wrapper)"} for s in starts)
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].evidence[0].startswith("weight (no wrapper): rank 0 ") and "after step 0" in hits[0].title


LOCAL_NORM = """
import torch, torch.distributed as dist, torch.nn as nn


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4) + 3 * rank).pow(2).mean().backward()
        {before}
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= world
        {after}
        torch.nn.utils.clip_grads_with_norm_(params, 0.01, norm)
        opt.step()
    dist.destroy_process_group()


main()
"""
NORM = "norm = torch.nn.utils.get_total_norm([p.grad for p in params])"


@pytest.mark.parametrize("before, after, caught", [("pass", NORM, False), (NORM, "pass", True)])
def test_a_norm_of_each_ranks_own_gradients_is_named(tmp_path, before, after, caught):
    """Hand-synced replicas clipped by a norm taken before the all_reduce: each rank scales the
    same averaged gradients by its own factor (the norm is read at step 0, before any optimizer
    has stepped: the reads are sorted out at the step's end)."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(LOCAL_NORM.format(before=before, after=after)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].where == f"train.py:{line_of(path, NORM)}: {NORM}" and "after step 0" in hits[0].title
    assert any("read each rank's own gradients" in e for e in hits[0].evidence)


ACCUMULATE = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        for micro in range(2):
            {before}
            loss = model(torch.randn(8, 4) + rank).pow(2).mean()
            {after}
            loss.backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


main()
"""
FLAG = "model.require_backward_grad_sync = micro == 1"


@pytest.mark.parametrize("before, after, caught", [(FLAG, "pass", False), ("pass", FLAG, True)])
def test_the_sync_flag_set_after_the_forward_is_named(tmp_path, before, after, caught):
    """build-nanogpt before its fix #30: DDP reads require_backward_grad_sync in its forward, so
    set after it, the last micro-step's backward is never all-reduced."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(ACCUMULATE.format(before=before, after=after)))
    report = run(str(path), checks=("state",))
    hits = [f for f in report.findings if f.code == "parameters-differ-after-step"]
    if not caught:
        assert hits == [] and report.status == "ok"
        return
    assert hits and hits[0].where == f"train.py:{line_of(path, FLAG)}: {FLAG}"
    assert any("set True only after it" in e for e in hits[0].evidence)


def test_an_edit_every_rank_makes_outside_the_optimizer_is_named():
    """Blind b60: every rank resets dead codebook entries from its own batch (`.data[...] =`):
    the same line on every rank, so not an uneven edit; the parameters part after it."""
    path = os.path.join(CORPUS, "b60_vq_dead_code_local_reset", "broken.py")
    fault = "quantizer.codebook.data[dead] = z[pick]"
    [f] = [f for f in run(path).findings if f.code == "parameters-differ-after-step"]
    assert f.where == f"broken.py:{line_of(path, fault)}: {fault}"
    assert any(e.startswith("every rank writes ") and "outside the optimizer at broken.py:" in e
               for e in f.evidence), f.evidence


def test_a_module_no_wrapper_holds_is_named_where_the_script_built_it():
    """Blind b55: a loss with learnable weights stepped by the optimizer beside the DDP model,
    never wrapped: nothing reduces its gradients; the line is the statement that made it."""
    path = os.path.join(CORPUS, "b55_margin_head_outside_ddp", "broken.py")
    fault = "criterion = CosFaceLoss(8, 4)"
    [f] = [f for f in run(path).findings if f.code == "parameters-differ-after-step"]
    assert f.where == f"broken.py:{line_of(path, fault)}: {fault}"
    assert f"the module holding them was built at {f.where} and never wrapped" in f.evidence
