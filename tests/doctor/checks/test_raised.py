"""Watch check "raised" (ddp_lab/doctor/checks/raised.py): the script raised on some rank.
The failing test runs a script whose rank 1 alone raises PyTorch's own shape error in its second
step (rank 0 then loses its peer: a consequence, never the root cause); the passing one runs the
same script with the shapes right, and a corpus case whose ranks hang (gloo's collective timeout
is the collectives check's, not a raise of the script's own). Both checks are attached: each
names what is its own and only that."""
import os
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
SCRIPT = '''
    """Rank 1 feeds a batch of the wrong width in step 1 (BAD): nn.Linear raises."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = DDP(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            width = 5 if BAD and rank == 1 and step == 1 else 4
            x = torch.ones(2, width)
            loss = model(x).sum()
            loss.backward()
            opt.step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
'''


def run(path):
    return corpus_report(path) or watch_script(str(path), nproc=2, timeout=20, checks=["raised", "collectives"])


@pytest.mark.slow
@pytest.mark.parametrize("bad", [True, False])
def test_script_raised_names_the_root_cause_rank_and_its_line(tmp_path, bad):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT).replace("BAD", str(bad)))
    report = run(path)
    hits = [f for f in report.findings if f.code == "script-raised"]
    if not bad:
        assert report.status == "ok" and not hits, [(f.code, f.title) for f in report.findings]
        return
    # the one finding: rank 0's lost peer (or its stop by the launcher) is no hang and no
    # parting of the collectives, only a consequence of rank 1's raise
    assert [f.code for f in report.findings] == ["script-raised"], [
        (f.code, f.title) for f in report.findings]
    f = hits[0]
    assert f.severity == "error" and f.lesson == "06"
    assert f.title == "rank 1 raised RuntimeError in step 1"
    assert "mat1 and mat2 shapes cannot be multiplied" in f.evidence[0]  # PyTorch's own message
    assert f.where == "train.py:17: loss = model(x).sum()"
    assert "train.py" in f.trace and "/tmp" not in f.trace  # sanitized: no machine path


@pytest.mark.slow
def test_a_collective_timeout_is_not_the_scripts_own_raise():
    report = run(os.path.join(CORPUS, "62_barrier_only_on_rank0", "broken.py"))
    assert report.status != "ok"  # both ranks raised gloo's "Timed out waiting" (a hang)
    assert not [f for f in report.findings if f.code == "script-raised"]
    assert [f.code for f in report.findings] == ["collectives-differ-between-ranks"]
