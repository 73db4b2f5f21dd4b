"""Watch check "collectives", what a collective's result may be used for
(ddp_lab/doctor/checks/_collectives_undefined.py, _collectives_uses.py, _collectives_uses_judge.py,
_collectives_chosen.py). Each code has failing tests (blind corpus cases' broken.py and scripts
written here, on 2 real ranks under gloo) and passing ones (their fixed.py; a script of the
legitimate uses: nothing):

    read-while-undefined         b10 (an async all_reduce read before wait: the read's line),
                                 b01 and b14 (a reduce's result read off its destination: the
                                 reduce's line); an async all_gather read through torch.stack
    broadcast-drops-rank-values  b02 (a skip flag from each rank's loss, broadcast from rank 0);
                                 an evaluation loss broadcast (tensor and object list)
    gradients-reduced-again      b12 (SUM of p.grad on top of DDP: an error); SUM then divided
                                 (a wasted collective: a warning); under no_sync: nothing

Fast tests hold the follower of undefined tensors (in this process, watch's own mode over a
tensor marked undefined by hand) and the source reading of a rank's choice, without ranks."""
import gc
import os
import textwrap
import tomllib
from functools import lru_cache

import pytest
import torch

from ddp_lab.doctor.checks import _collectives_chosen as chosen, collectives
from ddp_lab.doctor.checks._collectives_undefined import KEY, Undefined
from ddp_lab.doctor.checks.api import Context
from ddp_lab.doctor.watch.core import function_mode
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {"b01_plateau_val_reduce": "read-while-undefined",
         "b02_skip_flag_from_rank0": "broadcast-drops-rank-values",
         "b10_async_loss_logging": "read-while-undefined",
         "b12_grad_allreduce_on_ddp": "gradients-reduced-again",
         "b14_reduce_dst0_plateau": "read-while-undefined"}
MINE = ("read-while-undefined", "broadcast-drops-rank-values", "gradients-reduced-again")


@lru_cache(maxsize=None)
def run(path: str):
    from ddp_lab.doctor.watch.script import watch_script

    return corpus_report(path) or watch_script(path, nproc=2, timeout=90, checks=["collectives"])


def line_of(path, text) -> int:
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


def mine(report, code=None):
    return [f for f in report.findings if f.code in MINE and (code is None or f.code == code)]


# --- on real ranks: the blind corpus cases -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_blind_case_is_caught_at_its_fault_line(case):
    path = os.path.join(CORPUS, case, "broken.py")
    with open(os.path.join(CORPUS, case, "case.toml"), "rb") as f:
        fault = tomllib.load(f)["fault"]
    hits = mine(run(path), CASES[case])
    assert hits, [(f.code, f.where) for f in run(path).findings]
    assert hits[0].severity in ("error", "warning")
    assert hits[0].where.startswith(f"broken.py:{line_of(path, fault)}: "), hits[0].where


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_blind_case_fixed_gives_none_of_these(case):
    report = run(os.path.join(CORPUS, case, "fixed.py"))
    assert report.status == "ok"
    assert not mine(report), [(f.code, f.where) for f in mine(report)]


# --- on real ranks: scripts written here --------------------------------------------------------

BAD = '''
    """Each rank trains a small DDP model on its own shard, then evaluates it on its own shard."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = DDP(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
        for step in range(3):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            parts = [torch.zeros(1) for _ in range(world)]
            work = dist.all_gather(parts, loss.detach().reshape(1), async_op=True)
            total = torch.stack(parts).sum().item()  # READ
            work.wait()
            seen = torch.tensor([float(len(x))])
            dist.reduce(seen, dst=0)  # REDUCE
            if float(seen) > 0 and rank == 0:
                print(f"step {step} loss {total:.4f}")
            count = torch.ones(1)
            dist.reduce(count, group=dist.group.WORLD, group_dst=0)  # GROUP_DST
            assert count.item() >= 1
        with torch.no_grad():
            val = F.mse_loss(model(x), y).reshape(1)
        dist.broadcast(val, src=0)  # BROADCAST
        box = [float(val) + rank]
        dist.broadcast_object_list(box, src=0)  # OBJECTS
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


@pytest.mark.slow
def test_reads_while_undefined_and_broadcasts_of_own_values_are_found_at_their_lines(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(BAD))
    report = run(str(path))
    found = {(f.code, f.where.split(":")[1]) for f in mine(report)}
    at = {m: str(line_of(path, f"# {m}")) for m in ("READ", "REDUCE", "GROUP_DST", "BROADCAST", "OBJECTS")}
    assert found == {("read-while-undefined", at["READ"]), ("read-while-undefined", at["REDUCE"]),
                     ("read-while-undefined", at["GROUP_DST"]),  # the default group named
                     ("broadcast-drops-rank-values", at["BROADCAST"]),
                     ("broadcast-drops-rank-values", at["OBJECTS"])}, found
    off_root = next(f for f in mine(report) if f.where.split(":")[1] == at["REDUCE"])
    assert off_root.severity == "error" and any("rank 1 read it at train.py:" in e for e in off_root.evidence)
    assert not any("rank 0 read" in e for e in off_root.evidence)  # rank 0 is the destination


QUIET = '''
    """Broadcasts one rank decides on purpose, and results read where and when they are defined."""
    import os
    import tempfile
    import time

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        is_main = rank == 0
        torch.manual_seed(rank)
        seed = torch.randint(0, 2**31 - 1, (1,))  # a seed each rank draws: rank 0's is taken
        dist.broadcast(seed, src=0)
        torch.manual_seed(int(seed))
        net = nn.Linear(4, 1)
        if rank == 0:  # weights loaded on rank 0, sent to the others
            net.load_state_dict({k: torch.ones_like(v) for k, v in net.state_dict().items()})
        for p in net.parameters():
            dist.broadcast(p.data, src=0)
        model = DDP(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
        deadline = time.time() + 600
        for step in range(3):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            late = torch.tensor([float(time.time() > deadline) + rank])  # after backward: no measure
            dist.broadcast(late, src=0)
            opt.step()
            logged = loss.detach().clone()
            work = dist.all_reduce(logged, async_op=True)
            work.wait()
            mean = logged.item() / world
            other = loss.detach().clone()
            fut = dist.all_reduce(other, async_op=True).get_future()
            fut.wait()
            polled = loss.detach().clone()
            work = dist.all_reduce(polled, async_op=True)
            while not work.is_completed():
                time.sleep(0.001)
            total = torch.tensor([float(loss), 1.0])
            dist.reduce(total, dst=0)
            total /= world  # on every rank, but read on rank 0 only
            if rank == 0:
                print(f"step {step} {mean:.4f} {other.item():.4f} {polled.item():.4f} {total[0].item():.4f}")
            summed = torch.tensor([float(loss)])
            dist.reduce(summed, dst=0)
            dist.broadcast(summed, src=0)  # the destination's result sent to every rank
            assert summed.item() > 0
        with torch.no_grad():
            val = F.mse_loss(model(x), y).reshape(1)
            dist.broadcast(model.module.bias.data, src=0)  # a parameter: model state, not a value
        dist.all_reduce(val)
        stop = torch.zeros(1)
        if rank == 0:  # rank 0 decides, from the global value
            stop[0] = float(val.item() > 0)
        dist.broadcast(stop, src=0)
        mark = torch.tensor([float(step)]) if is_main else torch.zeros(1)
        dist.broadcast(mark, src=0)
        box = [tempfile.mkdtemp() if rank == 0 else None]  # a path rank 0 chose
        dist.broadcast_object_list(box, src=0)
        if rank == 0:
            os.rmdir(box[0])
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


@pytest.mark.slow
def test_legitimate_broadcasts_and_results_read_when_defined_give_nothing(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(QUIET))
    report = run(str(path))
    assert report.status == "ok", report.findings
    assert not [f for f in report.findings if f.code in collectives.CHECK.codes], \
        [(f.code, f.where) for f in report.findings]


GRADS = '''
    """Three DDP models trained side by side, their gradients all_reduced by hand three ways."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        a, b, c = DDP(nn.Linear(4, 1)), DDP(nn.Linear(4, 1)), DDP(nn.Linear(4, 1))
        opt = torch.optim.SGD([*a.parameters(), *b.parameters(), *c.parameters()], lr=0.1)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)
        for step in range(3):
            opt.zero_grad()
            F.mse_loss(a(x), y).backward()
            F.mse_loss(b(x), y).backward()
            with c.no_sync():
                F.mse_loss(c(x), y).backward()
            for p in a.parameters():
                dist.all_reduce(p.grad)  # SUMMED
            for p in b.parameters():
                dist.all_reduce(p.grad.data, op=dist.ReduceOp.SUM)  # DIVIDED
                p.grad /= world
            for p in c.parameters():
                dist.all_reduce(p.grad)  # BY HAND
                p.grad /= world
            opt.step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


@pytest.mark.slow
def test_gradients_reduced_again_on_ddp_summed_is_an_error_divided_a_warning(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(GRADS))
    hits = {f.where.split(":")[1]: f for f in mine(run(str(path)), "gradients-reduced-again")}
    summed, divided = str(line_of(path, "# SUMMED")), str(line_of(path, "# DIVIDED"))
    assert set(hits) == {summed, divided}, hits  # not `# BY HAND`: c's backward ran under no_sync
    assert hits[summed].severity == "error" and any("x2.000 DDP's" in e for e in hits[summed].evidence)
    assert hits[divided].severity == "warning" and any("x1.000 DDP's" in e for e in hits[divided].evidence)


# --- in this process: the follower of undefined tensors -----------------------------------------

@pytest.fixture
def follower():
    ctx = Context(__file__)
    undefined = Undefined(ctx)
    mode = function_mode(ctx)
    with mode:
        yield ctx, undefined
    assert not ctx._every or undefined.ids, "the mode follows every call with nothing to follow"


ORIGIN = ("off-root", "reduce", "train.py:9: dist.reduce(t, dst=0)", 0, 0)


def test_a_value_computed_from_an_undefined_tensor_is_read_where_it_leaves_torch(follower):
    ctx, undefined = follower
    t = torch.tensor([3.0, 4.0])
    undefined.follow(t, ORIGIN)
    t /= 2  # in place: still undefined, not yet read
    ratio = t[0] / t[1]  # a view, then a new tensor: both followed
    assert not ctx.records.get(KEY)
    value = ratio.item()
    reads = ctx.records[KEY]
    assert value == 0.75 and len(reads) == 1
    assert reads[0]["how"] == "Tensor.item" and reads[0]["route"] == "off-root"
    assert reads[0]["read"].startswith(f"test_collectives_uses.py:{line_of(__file__, 'value = ratio' + '.item()')}:")
    assert not undefined.ids and not ctx._every  # read once: nothing followed, the mode is plain


def test_an_overwrite_defines_the_tensor_and_a_write_elsewhere_is_a_read(follower):
    ctx, undefined = follower
    t = torch.ones(2)
    undefined.follow(t, ORIGIN)
    t.zero_()
    assert not undefined.ids and not ctx._every
    float(t.sum())
    assert not ctx.records.get(KEY)
    u, params = torch.ones(2), torch.zeros(2)
    undefined.follow(u, ORIGIN[:3] + (1, 0))
    params.add_(u)  # an update written from it (an optimizer's, say)
    assert [r["how"] for r in ctx.records[KEY]] == ["Tensor.add_ wrote it into another tensor"]


def test_a_tensor_that_dies_is_no_longer_followed(follower):
    ctx, undefined = follower
    t = torch.ones(3)
    undefined.follow(t, ORIGIN)
    assert ctx._every
    del t
    gc.collect()
    assert not undefined.ids and not ctx._every


def test_every_torch_function_is_served_only_while_switched_on():
    ctx = Context(__file__)
    seen = []
    switch = ctx.on_every_torch_function(lambda f, a, k, out: seen.append(f.__name__))
    with function_mode(ctx):
        torch.ones(1) + 1
        assert not seen
        switch(True)
        torch.ones(1) + 1
        switch(False)
        torch.ones(1) * 2
    assert seen == ["ones", "add"], seen  # Tensor.__add__ reaches the mode as Tensor.add


def test_a_follower_runs_after_a_function_s_own_handlers_and_its_error_is_recorded():
    ctx = Context(__file__)
    calls = []
    ctx.on_torch_function([torch.Tensor.add], lambda f, a, k, out: calls.append("own"))

    def follower(func, args, kwargs, result):
        calls.append(func.__name__)
        assert ctx.checking  # the follower's own torch calls are not seen by the checks
        if func.__name__ == "mul":
            raise ValueError("a check's bug")

    switch = ctx.on_every_torch_function(follower)
    with function_mode(ctx):
        switch(True)
        out = (torch.ones(1) + 1) * 3  # the script goes on
        switch(False)
    assert float(out) == 6.0 and not ctx.checking
    assert calls == ["ones", "own", "add", "mul"], calls
    assert any("ValueError: a check's bug" in e for e in ctx.records["check-errors"])


# --- the source: a value one rank chose on purpose ------------------------------------------------

SOURCE = '''
def main(rank, loss, val):
    flag = torch.tensor(float(loss.item() > 100))
    dist.broadcast(flag, src=0)
    stop = torch.zeros(1)
    if rank == 0:
        stop[0] = float(val > 1)
    dist.broadcast(stop, src=0)
    box = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    share(flag)
    dist.broadcast(torch.tensor(float(loss)), src=0)


def share(value):
    dist.broadcast(value, src=0)
'''


def test_a_value_set_under_a_test_of_the_rank_is_chosen_on_purpose(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(SOURCE)
    line = {text: n for n, text in enumerate(SOURCE.splitlines(), 1)}
    assert not chosen.chosen_at(str(path), line["    dist.broadcast(flag, src=0)"])
    assert chosen.chosen_at(str(path), line["    dist.broadcast(stop, src=0)"])
    assert chosen.chosen_at(str(path), line["    dist.broadcast_object_list(box, src=0)"])
    assert not chosen.chosen_at(str(path), line["    dist.broadcast(torch.tensor(float(loss)), src=0)"])
    helper = [[str(path), line["    dist.broadcast(value, src=0)"]], [str(path), line["    share(flag)"]]]
    assert not chosen.chosen(helper)
    assert chosen.rank_test(compile_expr("is_main_process")) and not chosen.rank_test(compile_expr("x > 0"))


def compile_expr(text):
    import ast

    return ast.parse(text, mode="eval").body


def test_the_model_s_forward_hook_survives_a_deepcopy_of_the_model():
    """The script's own copy.deepcopy(model) (an EMA copy; the checkpoints check's reload) copies
    the model's hooks: the check's must not drag the check and its context along."""
    import copy
    from types import SimpleNamespace

    from ddp_lab.doctor.checks._collectives_uses import Uses

    ctx = Context(__file__)
    uses = Uses(ctx)
    net = torch.nn.Linear(2, 1)
    uses.hook_model(SimpleNamespace(kind="ddp", module=net, wrapper=net))
    twin = copy.deepcopy(net)
    assert not uses.open
    twin(torch.ones(1, 2))
    assert uses.open  # the copy's forward opens the window too: a forward of the same model
