"""PyTorch's flight recorder in the launcher: each rank's collectives come back, and the report
says where the ranks part (a collective one rank never entered, a mismatch of op, of size)."""
import pickle
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from ddp_lab import launch
from ddp_lab.launching import divergence
from ddp_lab.launching.flight import Collective

pytestmark = pytest.mark.usefixtures("no_leftovers")


def third_all_reduce_on_rank0():
    for _ in range(2):
        dist.all_reduce(torch.ones(4))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(4))  # rank 1 never enters #3
    else:
        evaluate()


def evaluate():
    time.sleep(60)


def op_mismatch():
    dist.all_reduce(torch.ones(4))
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)  # gloo: both block, each in its own op


def size_mismatch():
    dist.all_reduce(torch.ones(4))
    t = torch.ones(4 * (dist.get_rank() + 1))  # [4] on rank 0, [8] on rank 1
    dist.broadcast(t, src=0)  # gloo returns without an error: a silent wrong answer
    return t.sum().item()


def test_third_all_reduce_on_rank0_only_is_named_in_the_report():
    result = launch(third_all_reduce_on_rank0, timeout=3)
    assert result.status == "timeout"
    r0, r1 = (r.collectives for r in result.ranks)
    assert len(r0) == len(r1) + 1 == 3
    assert r0[-1].op == "all_reduce" and r0[-1].seq == 3 and r0[-1].shape == "[4] float32"
    assert [c.op for c in r1] == ["all_reduce", "all_reduce"]
    line = ("flight recorder: the ranks part at collective #3: rank 0 entered all_reduce #3 "
            "([4] float32); rank 1 last entered #2 (all_reduce) "
            "and is in evaluate()")
    assert repr(result).splitlines()[-1] == "  " + line
    assert line in result.describe_failure() and line in result._repr_html_()
    assert "3    all_reduce [4] float32   -  <- the ranks part here" in divergence.table(result.ranks)
    for r in result.ranks:  # the dump thread had ended before the stacks were taken
        assert "_bootstrap_inner" not in r.stack and "wait_and_dump" not in r.stack, r.stack


def test_op_mismatch_is_named_by_torchs_analyser():
    result = launch(op_mismatch, timeout=3)
    assert result.status == "timeout"
    p = divergence.find(result.ranks)
    assert (p.seq, p.kind, p.analyser) == (2, "op", "COLLECTIVE_TYPE_MISMATCH")
    assert [p.entries[r].op for r in (0, 1)] == ["all_reduce", "broadcast"]
    assert "rank 1 entered broadcast #2 ([4] float32)" in repr(result)


def test_size_mismatch_is_found_in_a_run_that_returned():
    result = launch(size_mismatch, timeout=20)
    assert result.ok  # gloo: no error, no hang
    p = divergence.find(result.ranks)
    assert (p.seq, p.kind, p.analyser) == (2, "size", "SIZE_OR_SYNTAX_MISMATCH")
    assert [p.entries[r].shape for r in (0, 1)] == ["[4] float32", "[8] float32"]
    assert "flight recorder" not in repr(result)  # the text of a run that did not time out is unchanged


def test_a_plain_launch_records_and_buffer_size_0_turns_it_off(tmp_path):
    """torch records by default (TORCH_FR_BUFFER_SIZE unset: 2000 entries, torch 2.13's
    FlightRecorder.hpp:110-114): a launch without a timeout brings the record back too; 0, under
    either name torch reads, turns recording off and the launcher finds no record."""
    plain = launch(size_mismatch)
    assert [c.op for c in plain.ranks[1].collectives] == ["all_reduce", "broadcast"]
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        off = launch(size_mismatch, env={name: "0"})
        assert all(r.collectives is None for r in off.ranks), name
    result = launch(size_mismatch, timeout=20)
    path = tmp_path / "run.pkl"
    result.save(path)
    code = ("import sys; sys.modules['torch'] = None; import pickle; "
            f"r = pickle.load(open({str(path)!r}, 'rb')); print(r.ranks[1].collectives[-1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "broadcast [8] float32"
    assert isinstance(pickle.loads(pickle.dumps(result)).ranks[0].collectives[0], Collective)


def test_a_hung_ranks_record_lands_at_the_dump_prefix_plus_its_rank(tmp_path):
    """TORCH_FR_DUMP_TEMP_FILE=PREFIX: each rank's record, dumped when the launcher stops it,
    is also written to PREFIX + rank (the name NCCL's watchdog uses), readable as torch wrote it."""
    result = launch(third_all_reduce_on_rank0, timeout=3,
                    env={"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "trace_")})
    assert result.status == "timeout"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace_0", "trace_1"]
    for r in result.ranks:
        entries = pickle.loads((tmp_path / f"trace_{r.rank}").read_bytes())["entries"]
        assert [e["collective_seq_id"] for e in entries] == [c.seq for c in r.collectives]


def test_the_doctors_hang_finding_carries_the_flight_recorder_table():

    from ddp_lab import doctor

    report = doctor(Rank0LogsInForward, torch.randn(8, 4), timeout=4)
    hang = next(f for f in report.findings if f.code == "hang")
    assert any(e.startswith("flight recorder: the ranks part at collective #") for e in hang.evidence)
    assert "--- flight recorder ---" in hang.trace and "<- the ranks part here" in hang.trace


class Rank0LogsInForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if dist.get_rank() == 0:
            dist.all_reduce(y.detach().mean())
        return y


def test_native_stacks_say_clearly_when_py_spy_is_missing(monkeypatch):
    from ddp_lab.launching import pyspy

    monkeypatch.setenv("PATH", "/nonexistent")
    if pyspy.find() is not None:
        pytest.skip("py-spy is installed beside this Python")
    with pytest.raises(RuntimeError, match="needs py-spy, which is not installed.*pip install py-spy"):
        launch(third_all_reduce_on_rank0, timeout=3, native_stacks=True)


def test_native_stacks_show_the_frames_below_python():
    from ddp_lab.launching import pyspy

    if pyspy.find() is None:
        pytest.skip("py-spy is not installed (optional: pip install py-spy)")
    result = launch(third_all_reduce_on_rank0, timeout=3, native_stacks=True)
    native = result.ranks[0].native_stack
    assert "Python v3" in native, native[:300]
    assert "all_reduce" in native and "(libtorch" in native  # C++ frames faulthandler cannot see
    assert "native stack (py-spy)" in result._repr_html_()
