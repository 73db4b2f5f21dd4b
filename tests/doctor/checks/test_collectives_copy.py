"""Watch check "collectives", code `collective-output-discarded`
(ddp_lab/doctor/checks/_collectives_copy.py): an in-place collective (all_reduce, broadcast,
reduce) given a copy made in its own argument writes its result where nothing reads it.
Failing: `dist.all_reduce(p.grad.float())` of a bfloat16 gradient, on 2 real ranks under gloo,
named at its line; the blind case b65. Passing: a view of the gradient (it writes into it), a
conversion that returns the tensor itself (`.float()` of a float32 tensor), a new tensor
reduced only to wait for the others (`torch.zeros(1)`); b65's fixed.py."""
import os
import textwrap

import pytest

from conftest import corpus_report

CODE = "collective-output-discarded"
B65 = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch",
                   "b65_grad_sync_float_copy")

SCRIPT = '''
    import torch
    import torch.distributed as dist
    import torch.nn as nn


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = nn.Linear(4, 1).to(torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            x = torch.full((8, 4), float(rank + 1), dtype=torch.bfloat16)
            model(x).float().pow(2).mean().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad.float())  # COPY
                dist.all_reduce(p.grad.view(-1))  # VIEW
            flag = torch.ones(1)
            dist.all_reduce(flag.float())  # SAME
            dist.all_reduce(torch.zeros(1))  # FRESH
            opt.step()
            opt.zero_grad()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


def line_of(path, text) -> int:
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


@pytest.mark.slow
def test_a_copy_reduced_in_place_is_an_error_at_its_line_the_others_quiet(tmp_path):
    from ddp_lab.doctor.watch.script import watch_script

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    report = watch_script(str(path), nproc=2, timeout=90, checks=["collectives"])
    assert report.status == "ok", report.findings
    found = [(f.where.split(":")[1], f.severity) for f in report.findings if f.code == CODE]
    assert found == [(str(line_of(path, "# COPY")), "error")], [(f.code, f.where) for f in report.findings]
    [f] = [f for f in report.findings if f.code == CODE]
    assert "seen on rank 0, 1" in f.evidence and f.fix.startswith("reduce the tensor itself")


@pytest.mark.slow
@pytest.mark.parametrize("version", ["broken", "fixed"])
def test_blind_case_b65(version):
    from ddp_lab.doctor.watch.script import watch_script

    path = os.path.join(B65, f"{version}.py")
    report = corpus_report(path) or watch_script(path, nproc=2, timeout=120)
    hits = [f for f in report.findings if f.code == CODE]
    if version == "fixed":
        assert not hits, [(f.code, f.where) for f in hits]
    else:
        fault = line_of(path, "dist.all_reduce(p.grad.float(), op=dist.ReduceOp.SUM)")
        assert hits and hits[0].where.startswith(f"broken.py:{fault}:"), \
            [(f.code, f.where) for f in report.findings]
