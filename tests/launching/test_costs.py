"""What a rank costs, as the launcher reports it (ddp_lab.launching.costs): each rank's peak resident memory,
the steps it marked with `measured_step()` (memory, child processes, collectives per step from
the flight recorder), on real ranks; and the per-step arithmetic on plain records."""
import pickle

import pytest

import ddp_lab
from ddp_lab.launching.costs import (ChildMemory, StepRecord, collectives_per_step, output_bytes,
                           step_collectives)
from ddp_lab.launching.flight import Collective

MIB = 2 ** 20


def _allocate_on_rank0(mb):
    import torch
    import torch.distributed as dist

    held = torch.ones(mb * MIB // 4) if dist.get_rank() == 0 else None  # written: resident
    return 0 if held is None else int(held.numel())


def test_the_peak_of_the_rank_that_allocates_rises_by_what_it_allocated():
    result = ddp_lab.launch(_allocate_on_rank0, 256, timeout=60).raise_for_status()
    zero, one = (r.peak_rss_mb for r in result.ranks)
    assert zero - one >= 256 * 0.95, (zero, one)
    assert one > 50  # a rank with torch imported: a real figure, not a default
    again = pickle.loads(pickle.dumps(result))  # plain data: saved and reloaded as it was
    assert [r.peak_rss_mb for r in again.ranks] == [zero, one]


def _known_loop(steps=6):
    """Step i: (i % 3) + 1 all_reduces, and a broadcast on even steps; nothing between steps
    is counted (the barrier before each step)."""
    import torch
    import torch.distributed as dist

    from ddp_lab.instruments.probes import measured_step

    t = torch.ones(4)
    for i in range(steps):
        dist.barrier()  # outside the steps: in the record, in no step
        with measured_step():
            for _ in range(i % 3 + 1):
                dist.all_reduce(t)
            if i % 2 == 0:
                dist.broadcast(t, src=0)
    return steps


def test_collectives_are_counted_per_step_on_a_known_loop():
    result = ddp_lab.launch(_known_loop, timeout=60).raise_for_status()
    for r in result.ranks:
        assert r.collectives_per_step("all_reduce") == [1, 2, 3, 1, 2, 3]
        assert r.collectives_per_step("broadcast") == [1, 0, 1, 0, 1, 0]
        assert r.collectives_per_step() == [2, 2, 4, 1, 3, 3]
        assert [c.op for c in r.step_collectives()[0]] == ["all_reduce", "broadcast"]
        assert sum(c.op == "barrier" or c.op == "all_reduce" and c.sizes == ((1,),)
                   for c in r.collectives) >= 6  # the barriers are recorded, outside steps
    text = repr(result.costs())
    assert "rank 0: peak RSS" in text and "collectives per step 2 2 4 1 3 3" in text


def _ddp_buckets(steps=5):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.instruments.probes import measured_step

    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)]),
                bucket_cap_mb=0.1)
    for _ in range(steps):
        with measured_step():
            model(torch.randn(8, 128)).sum().backward()
    return len(model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(","))


def test_ddp_all_reduces_one_bucket_each_per_step():
    result = ddp_lab.launch(_ddp_buckets, timeout=60).raise_for_status()
    buckets = result.values[0]
    assert buckets >= 2  # 64 KiB weights in buckets closed once they pass 0.1 MiB
    for r in result.ranks:
        counts = r.collectives_per_step("all_reduce")
        assert counts[0] == 1  # DDP's first iteration: one bucket for every parameter
        assert counts[2:] == [buckets] * 3


def _a_step_and_a_worker():
    import torch
    from torch.utils.data import DataLoader, Dataset

    from ddp_lab.instruments.probes import measured_step

    class Grows(Dataset):
        kept = []

        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 0:  # in the worker: 64 MiB it keeps, written so it is resident
                Grows.kept.append(torch.ones(64 * MIB // 4))
            return i

    with measured_step():
        big = torch.ones(128 * MIB // 4)
        del big
    with measured_step():
        pass
    loader = DataLoader(Grows(), batch_size=1, num_workers=1, multiprocessing_context="fork")
    for _ in loader:
        with measured_step():
            pass
    return 0


def test_a_step_measures_its_own_peak_and_the_rank_s_workers(no_leftovers):
    result = ddp_lab.launch(_a_step_and_a_worker, world_size=1, timeout=60).raise_for_status()
    first, second, *loading = result.ranks[0].steps
    assert first.growth_mb >= 120  # 128 MiB allocated and freed inside the step
    assert second.growth_mb < 32  # the high-water mark was reset as the step began
    assert result.ranks[0].peak_rss_mb >= first.peak_mb  # a reset peak still counts at exit
    workers = {c.pid for s in loading for c in s.children}
    assert len(workers) == 1 and not first.children
    assert max(c.private_mb for s in loading for c in s.children) >= 60
    assert all(c.rss_mb >= c.private_mb for s in loading for c in s.children)


# --- the arithmetic on plain records ---------------------------------------------------------

def _c(seq, op="all_reduce", group="0", created=0.0, out=((4,),), dtype="float32"):
    return Collective(seq, op, ((4,),), (dtype,), group=group, created=created,
                      out_sizes=out, out_dtypes=(dtype,) * len(out))


def _s(seq_start, seq_end, start=0.0, end=0.0):
    return StepRecord(start, end, 1.0, 1.0, 1.0, seq_start, seq_end)


def test_steps_whose_collectives_left_the_ring_buffer_are_unknown_not_zero():
    kept = [_c(n) for n in range(5, 9)]  # the recorder kept #5..#8 of 8
    steps = [_s(0, 2), _s(2, 4), _s(4, 6), _s(6, 8)]
    assert collectives_per_step(kept, steps) == [None, None, 2, 2]


def test_another_group_s_collectives_fall_into_steps_by_time():
    record = [_c(1, created=1.5), _c(1, group="1", created=1.6), _c(2, group="1", created=2.5)]
    steps = [_s(0, 1, start=1.0, end=2.0), _s(1, 1, start=2.0, end=3.0)]
    assert collectives_per_step(record, steps) == [2, 1]
    no_group = [_s(None, None, start=1.0, end=2.0)]
    assert collectives_per_step(record, no_group) == [2]


def test_missing_records_are_named():
    with pytest.raises(ValueError, match="rank 3 marked no steps: wrap each step"):
        step_collectives([], None, rank=3)
    with pytest.raises(ValueError, match="rank 1 left no flight record: it made no process group, or recording was off"):
        step_collectives(None, [_s(0, 1)], rank=1)


def test_output_bytes_read_the_shapes_the_recorder_kept():
    assert output_bytes(_c(1, out=((2, 262144),))) == 2 * 262144 * 4
    assert output_bytes(_c(1, out=())) == 0
    assert output_bytes(_c(1, out=((3,),), dtype="int64")) == 24


def test_a_step_record_reads_as_memory_and_time():
    step = StepRecord(10.0, 10.5, 100.0, 110.0, 150.0, 0, 3, (ChildMemory(7, 90.0, 20.0),))
    assert step.seconds == 0.5 and step.growth_mb == 50.0
    assert step.children[0].private_mb == 20.0


def _spawned():
    from ddp_lab.instruments.probes import measured_step
    from ddp_lab.launching.rankinfo import restart_clock

    with measured_step():
        pass
    return restart_clock()


def test_a_spawned_rank_reports_its_steps_and_restarts_its_clock():
    # `python -m ddp_lab.launching.child` runs the package's module, not a second copy as __main__
    result = ddp_lab.launch(_spawned, world_size=1, start_method="spawn", timeout=60)
    assert result.raise_for_status().values == [True]
    assert len(result.ranks[0].steps) == 1


def test_ddp_lab_run_shows_what_the_ranks_cost(capsys):
    from ddp_lab.cli import main

    assert main(["run", "18", "unasked_collectives", "--variant", "fixed"]) == 0
    out = capsys.readouterr().out
    assert "costs per rank (18/unasked_collectives fixed, world_size=2)" in out
    assert out.count("collectives per step 1 3 1 2 1 1 1 2") == 2  # both ranks, by step


def test_counts_per_step_write_a_long_run_once():
    # lesson 18's worker_copies printed 40 zeros as "collectives per step" (issue 38, point 14)
    from ddp_lab.launching.costs import _runs

    assert _runs(["0"] * 40) == "0 in each of 40 steps"
    assert _runs("1 3 2 2 2 2 2 1".split()) == "1 3 2x5 1"
    assert _runs("1 3 1 2 1 1 1 2".split()) == "1 3 1 2 1 1 1 2"  # runs of 3 stay as they are
    assert _runs(["?", "?"]) == "? ?" and _runs([]) == ""
