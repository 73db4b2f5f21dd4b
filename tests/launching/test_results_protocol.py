"""The statuses are one declared set, checked where a result or a declaration is made; the rank
tells the launcher what its record holds by an explicit kind."""
import pickle

import pytest

import rank_bodies as body
from ddp_lab import launch
from ddp_lab.course.registry import Expect
from ddp_lab.launching.results import STATUSES, ErrorInfo, RankResult, RunResult


def test_an_unknown_status_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown status 'hung': use one of ok, error, timeout, crashed"):
        RankResult(0, "hung")
    with pytest.raises(ValueError, match="unknown status 'timed out'"):
        Expect("timed out")


def test_a_result_pickles_and_prints_as_before():
    run = RunResult([RankResult(0, "ok", value=1),
                     RankResult(1, "error", error=ErrorInfo("ValueError", "bad"), failed_at=1.0)],
                    label="x")
    again = pickle.loads(pickle.dumps(run))
    assert repr(again) == repr(run) == (
        "RunResult(x: error, world_size=2, backend=gloo)\n  rank 0: ok\n  rank 1: error    ValueError: bad")
    assert STATUSES == ("ok", "error", "timeout", "crashed")


def test_a_returned_exception_is_a_value_not_an_error():
    # The record says which it is: a rank that returns an exception object returned a value.
    result = launch(body.return_an_exception, init_process_group=False)
    assert result.status == "ok"
    assert [type(v).__name__ for v in result.values] == ["KeyError", "KeyError"]


def test_a_stopped_ranks_stack_leaves_out_threads_that_only_run_pythons_library():
    """A weakref callback's thread, caught by the dump or not by timing, must not change what a
    notebook prints; the main thread and any thread in torch (or ours) stay."""
    import sysconfig

    from ddp_lab.launching.frames import without_passing_threads

    std = sysconfig.get_paths()["stdlib"]
    main = ('Current thread 0x2 (most recent call first):\n'
            '  File "/x/torch/distributed/distributed_c10d.py", line 3 in all_reduce\n'
            '  File "<string>", line 1 in <module>\n')
    worker = ('Thread 0x3 (most recent call first):\n'
              '  File "/x/torch/utils/data/_utils/pin_memory.py", line 3 in _pin_memory_loop\n')
    passing = f'Thread 0x1 (most recent call first):\n  File "{std}/_weakrefset.py", line 45 in _remove\n'
    kept = without_passing_threads(passing + "\n" + main + "\n" + worker)
    assert "_weakrefset" not in kept
    assert "all_reduce" in kept and "_pin_memory_loop" in kept
    assert without_passing_threads(main) == main


def test_a_childfailederror_headlines_its_summary_not_its_frame():
    """torchrun's ChildFailedError message starts with a rule of "=" (errors/__init__.py:193-202):
    the headline is the line under it, the summary's title (issue 47)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {r: ProcessFailure(local_rank=r, pid=100 + r, exitcode=2, error_file="<N/A>")
                for r in (0, 1)}
    error = ErrorInfo("ChildFailedError", str(ChildFailedError("train.py", failures)))
    assert error.message.lstrip().startswith("=====")
    assert str(error) == "ChildFailedError: train.py FAILED"
    assert ErrorInfo("ValueError", "\n-----\nbad\nmore").first_line == "bad"
