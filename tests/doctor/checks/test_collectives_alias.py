"""Watch check "collectives", code `collective-outputs-alias`
(ddp_lab/doctor/checks/_collectives_alias.py): a collective that writes several outputs
(all_gather's tensor_list, all_to_all's output list, gather's gather_list) is given outputs that
share no memory. Failing: an all_gather into `[torch.zeros_like(t)] * W` (one tensor W times)
and a gather into two overlapping views of one buffer, on 2 real ranks under gloo, each
named at the line that made the list; the blind case b53. Passing: a list comprehension,
empty_like per rank, disjoint views of one buffer, column views (strided, not judged),
all_gather_into_tensor (in place at this rank's slot), all_gather_object; b53's fixed.py.
Fast tests: the memory comparison and the source reading, without ranks."""
import os
import textwrap

import pytest
import torch

from ddp_lab.doctor.checks import _collectives_alias as alias
from conftest import corpus_report

CODE = "collective-outputs-alias"
B53 = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch",
                   "b53_allgather_aliased_outputs")

SCRIPT = '''
    import torch
    import torch.distributed as dist


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        t = torch.full((3,), float(rank))
        outs = [torch.zeros_like(t)] * world  # ALIASED
        dist.all_gather(outs, t)
        buf = torch.zeros(5)
        dist.gather(t, [buf[0:3], buf[2:5]] if rank == 0 else None, dst=0)  # OVERLAP
        good = [torch.zeros_like(t) for _ in range(world)]
        dist.all_gather(good, t)
        assert [g[0].item() for g in good] == list(range(world))
        dist.all_gather([torch.empty_like(t), torch.empty_like(t)], t)
        flat = torch.zeros(world * 3)
        dist.all_gather(list(flat.split(3)), t)
        cols = torch.zeros(3, world)
        dist.all_gather([cols[:, i] for i in range(world)], t)
        dist.all_gather_into_tensor(flat, flat[rank * 3:(rank + 1) * 3])
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank})
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
def test_aliased_output_lists_are_errors_at_the_line_that_made_them_correct_lists_quiet(tmp_path):
    from ddp_lab.doctor.watch.script import watch_script

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    report = watch_script(str(path), nproc=2, timeout=90, checks=["collectives"])
    assert report.status == "ok", report.findings
    found = sorted((f.where.split(":")[1], f.severity) for f in report.findings if f.code == CODE)
    made, overlap = line_of(path, "# ALIASED"), line_of(path, "# OVERLAP")
    assert found == sorted([(str(made), "error"), (str(overlap), "error")]), \
        [(f.code, f.where) for f in report.findings]
    gathered = next(f for f in report.findings if f.code == CODE and f"py:{made}:" in f.where)
    assert any("entries 0, 1 share memory" in e for e in gathered.evidence), gathered.evidence
    assert any(f"train.py:{made + 1}:" in e for e in gathered.evidence), gathered.evidence


@pytest.mark.slow
@pytest.mark.parametrize("version", ["broken", "fixed"])
def test_blind_case_b53(version):
    from ddp_lab.doctor.watch.script import watch_script

    path = os.path.join(B53, f"{version}.py")
    report = corpus_report(path) or watch_script(path, nproc=2, timeout=120)
    hits = [f for f in report.findings if f.code == CODE]
    if version == "fixed":
        assert not hits, [(f.code, f.where) for f in hits]
    else:
        fault = line_of(path, "out = [torch.zeros_like(t)] * dist.get_world_size()")
        assert hits and hits[0].where.startswith(f"broken.py:{fault}:"), \
            [(f.code, f.where) for f in report.findings]


def test_memory_is_compared_by_storage_and_byte_range():
    t = torch.zeros(3)
    assert alias.shared("all_gather", {"tensor_list": [t] * 3}) == [[0, 1], [0, 2]]
    assert alias.shared("all_gather", {"tensor_list": [t, t.clone()]}) is None
    buf = torch.zeros(8)
    assert alias.shared("all_gather", {"tensor_list": list(buf.split(4))}) is None
    assert alias.shared("all_to_all", {"output_tensor_list": [buf[:5], buf[4:]]}) == [[0, 1]]
    cols = torch.zeros(3, 2)  # strided, interleaved, no element shared: not judged
    assert alias.shared("all_gather", {"tensor_list": [cols[:, 0], cols[:, 1]]}) is None
    assert alias.shared("all_gather", {"tensor_list": [cols[:, 0], cols[:, 0]]}) == [[0, 1]]
    assert alias.shared("gather", {"gather_list": None}) is None
    assert alias.shared("reduce_scatter", {"input_list": [t, t]}) is None  # inputs: read only


def test_the_list_s_making_line_is_read_from_the_source(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("def f(t, w):\n    out = None\n    out = [t] * w\n"
                    "    dist.all_gather(out, t)\n    return out\n")
    assert alias.made_at(str(path), 4, "all_gather") == 3
    assert alias.made_at(str(path), 4, "gather") is None  # no such call there
