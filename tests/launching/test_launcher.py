"""The launcher on real ranks: every status, every fault case, no process left behind."""
import os
import pickle
import threading
import time

import pytest

import rank_bodies as body
from conftest import alive
from ddp_lab import DistributedRunError, RunResult, launch

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_ok_every_rank_returns_and_gets_torchrun_env():
    result = launch(body.add_ranks, 0.5)
    assert result.status == "ok" and result.ok
    assert [v["sum"] for v in result.values] == [3.5, 3.5]
    envs = [v["env"] for v in result.values]
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert result.raise_for_status() is result


def test_world_size_four():
    result = launch(body.add_ranks, world_size=4)
    assert result.ok and [v["sum"] for v in result.values] == [10.0] * 4


def test_two_launches_back_to_back_and_side_by_side():
    first, second = launch(body.add_ranks), launch(body.add_ranks)
    assert first.ok and second.ok
    assert first.values[0]["env"]["MASTER_PORT"] != second.values[0]["env"]["MASTER_PORT"]
    results = [None, None]

    def go(i):
        results[i] = launch(body.add_ranks, i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status for r in results] == ["ok", "ok"]
    assert [r.values[0]["sum"] for r in results] == [3.0, 4.0]


def test_exception_on_one_rank_is_the_root_cause():
    result = launch(body.raise_on_rank, timeout=20, grace=2)
    assert result.status == "error"
    root = result.root_cause
    assert root.rank == 1 and root.error.type == "IndexError"
    assert "index 7 is out of bounds" in root.error.message
    assert "raise_on_rank" in root.error.traceback
    assert result.failures[0] is root and result.ranks[0].status in ("error", "timeout")
    assert repr(result).splitlines()[2].endswith("<- root cause")
    with pytest.raises(DistributedRunError, match="rank 1 failed first: IndexError"):
        result.raise_for_status()


def test_collective_on_rank0_only_times_out_with_stacks_naming_the_call():
    start = time.time()
    result = launch(body.all_reduce_on_rank0_only, timeout=3)
    assert time.time() - start < 3 + 5
    assert result.status == "timeout"
    assert [r.status for r in result.ranks] == ["timeout", "timeout"]
    assert "in all_reduce" in result.ranks[0].stack and "all_reduce_on_rank0_only" in result.ranks[0].stack
    assert result.ranks[0].stuck_in() == "all_reduce()"
    assert "in all_reduce_on_rank0_only" in result.ranks[1].stack and "sleep" not in result.ranks[1].headline
    assert "0x" not in repr(result) and "/" not in repr(result).split("\n", 1)[1]


def test_a_rank_that_returns_while_its_peer_reduces_is_named_not_the_peer():
    # Rank 1 returns at once; rank 0's all_reduce loses its only partner (gloo: "Connection
    # closed by peer"). The report names rank 1's return, not rank 0's consequence.
    result = launch(body.return_while_peer_reduces, timeout=20)
    assert [r.status for r in result.ranks] == ["error", "ok"]
    assert result.ranks[0].is_collateral
    said = "rank 1 returned while rank 0 was in all_reduce()"
    assert result.returned_while() == said
    assert result.describe_failure().splitlines()[:2] == [
        said + ": a collective needs every rank of the group",
        "then rank 0: RuntimeError: lost its connection to a peer (a consequence)"]
    assert "failed first" not in result.describe_failure()
    # the flight recorder's evidence (a timeout was given): rank 1 never entered collective #1
    assert ("rank 0 entered all_reduce #1 ([4] float32); rank 1 entered no collective and "
            "returned") in result.describe_failure()
    rows = repr(result).splitlines()
    assert rows[2] == "  rank 1: ok       returned while rank 0 was in all_reduce()  <- root cause"
    assert "root cause" not in rows[1]
    assert "returned while rank 0 was in all_reduce() ← root cause" in result._repr_html_()


def test_a_rank_that_did_its_part_of_the_collective_is_not_said_to_have_left_it():
    # Rank 1 all-reduces 3 numbers and returns; rank 0 waits in the same all_reduce for a 4th.
    # The flight recorder saw both enter collective #1: the mismatch is the story, not a return.
    result = launch(body.reduce_four_and_three, timeout=20)
    assert [r.status for r in result.ranks] == ["error", "ok"], repr(result)  # as lesson 03's
    assert result.returned_while() == ""
    assert "(size mismatch" in result.describe_failure()


def test_os_exit_3_is_a_crash_with_its_status():
    result = launch(body.exit_3_on_rank1, timeout=20, grace=2)
    assert result.status == "crashed"
    assert result.ranks[1].status == "crashed" and result.ranks[1].exitcode == 3
    assert result.ranks[1].headline == "exited with status 3 without a Python exception"
    assert result.ranks[0].status == "ok" and result.ranks[0].value == "survived"


def test_sigkill_is_a_crash_with_the_signal_name():
    result = launch(body.sigkill_rank1, timeout=20, grace=2)
    assert result.status == "crashed" and result.ranks[1].signal == "SIGKILL"
    assert result.ranks[1].headline == "killed by SIGKILL"


def test_ten_megabytes_of_output_is_captured_whole():
    result = launch(body.write_10mb, timeout=30)
    assert result.ok
    for r in result.ranks:
        assert len(r.stdout) == 10 * 1024 * 1024
        assert "fd-level stderr" in r.stderr


def test_unpicklable_return_value_is_that_ranks_error():
    result = launch(body.return_unpicklable, timeout=20)
    assert result.status == "error"
    assert all(r.error.type == "TypeError" and "cannot be pickled" in r.error.message for r in result.ranks)


def test_grandchild_of_a_hung_rank_is_killed_with_it():
    result = launch(body.start_grandchild_and_hang, timeout=3)
    assert result.status == "timeout"
    pids = [int(r.stdout.split()[1]) for r in result.ranks]
    time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def test_a_killed_rank_leaves_nothing_in_the_temporary_folder(tmp_path):
    """A rank's folder lives in the launch's scratch folder (rankinfo.scratch_dir), inside the
    launcher's own, which the launcher removes after killing the hung ranks (issue 47)."""
    from temp_entries import temp_folder_of_its_own

    with temp_folder_of_its_own(tmp_path) as env:
        result = launch(body.make_a_folder_then_hang, timeout=2, env=env)
    assert result.status == "timeout"
    folders = [r.stdout.split()[0] for r in result.ranks]
    assert all(f.startswith(str(tmp_path / "ddp-lab-")) and "/scratch/ddp-lab-body-" in f for f in folders)
    assert not any(os.path.exists(f) for f in folders)


def test_grandchild_of_a_finished_rank_is_killed_too():
    result = launch(body.start_grandchild_and_return, timeout=20)
    assert result.ok
    time.sleep(0.2)
    assert not any(alive(p) for p in result.values)


def test_env_is_set_before_the_function_runs():
    result = launch(body.read_env, "DDP_LAB_TEST", env={"DDP_LAB_TEST": "yes"})
    assert result.values == [{"DDP_LAB_TEST": "yes"}] * 2


def test_tmpdir_is_the_ranks_temporary_folder_even_in_a_rank_forked_from_a_warm_server(tmp_path):
    """A module the fork server preloads may have asked tempfile for its folder already (it
    caches the answer); the rank asks again, under its own environment."""
    for _ in range(2):  # the second launch forks from a server that preloaded this module
        result = launch(body.temporary_folder, env={"TMPDIR": str(tmp_path)})
        assert result.values == [str(tmp_path)] * 2


def test_torch_distributed_debug_takes_effect_in_preloaded_ranks():
    assert launch(body.debug_level).values[0] == "DebugLevel.OFF"
    result = launch(body.debug_level, env={"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert result.values == ["DebugLevel.INFO"] * 2


def test_import_time_variable_starts_the_launch_by_plain_spawn():
    # TORCH_CPP_LOG_LEVEL is read when torch's C++ libraries load: only a fresh interpreter sees it.
    quiet = launch(body.add_ranks, env={"TORCH_CPP_LOG_LEVEL": "ERROR"}, start_method="spawn")
    loud = launch(body.add_ranks, env={"TORCH_CPP_LOG_LEVEL": "INFO"})
    assert quiet.ok and loud.ok
    assert "ProcessGroupGloo" not in quiet.ranks[0].stderr
    assert "ProcessGroupGloo" in loud.ranks[0].stderr or "[I" in loud.ranks[0].stderr


def test_init_process_group_false_leaves_the_group_to_the_function():
    assert launch(body.no_group, init_process_group=False).values == [False, False]
    assert launch(body.no_group).values == [True, True]


def test_function_defined_here_travels_by_value():
    class Local:
        factor = 3

    def local_fn():
        return Local.factor * 2

    assert launch(local_fn).values == [6, 6]


def test_an_argument_named_like_an_option_is_bound_with_partial():
    import functools

    def fn(timeout=None, label=None):
        return timeout, label

    assert launch(functools.partial(fn, timeout=3, label="x"), timeout=30).values == [(3, "x")] * 2


def test_keyboard_interrupt_in_the_parent_leaves_nothing_behind_and_next_launch_works(sigint_raises):
    def interrupt():
        time.sleep(1.0)
        import _thread
        _thread.interrupt_main()

    threading.Thread(target=interrupt).start()
    with pytest.raises(KeyboardInterrupt):
        launch(body.all_reduce_on_rank0_only, timeout=30)
    assert launch(body.add_ranks).ok


def test_result_saves_and_loads_without_torch_distributed(tmp_path):
    result = launch(body.add_ranks)
    result.save(tmp_path / "run.pkl")
    loaded = RunResult.load(tmp_path / "run.pkl")
    assert repr(loaded) == repr(result) and loaded.values == result.values
    assert "torch.distributed" not in pickle.dumps(loaded).decode("latin-1")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"world_size": 0}, ValueError, "world_size must be an integer >= 1"),
    ({"world_size": 1.5}, ValueError, "world_size must be an integer >= 1"),
    ({"timeout": 0}, ValueError, "timeout must be a number of seconds > 0"),
    ({"timeout": -3}, ValueError, "timeout must be a number of seconds > 0"),
    ({"backend": "mpi"}, ValueError, "unknown backend 'mpi'"),
    ({"backend": "nccl"}, RuntimeError, "backend 'nccl' needs one GPU per rank"),
    ({"env": ["A=1"]}, TypeError, "env must be a dict"),
    ({"start_method": "fork"}, ValueError, "unknown start_method 'fork'"),
])
def test_bad_input_is_refused_before_any_process_starts(kwargs, error, match):
    before = len(os.listdir("/proc"))
    with pytest.raises(error, match=match):
        launch(body.add_ranks, **kwargs)
    assert len(os.listdir("/proc")) <= before + 2


def test_unpicklable_function_or_argument_is_named():
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"argument 0 \(lock\) .*cannot be pickled"):
        launch(body.add_ranks, lock)
    with pytest.raises(TypeError, match="needs a function"):
        launch("not a function")


def test_text_repr_is_deterministic():
    texts = {repr(launch(body.raise_on_rank, timeout=20, grace=2)) for _ in range(2)}
    assert len(texts) == 1


def test_ranks_and_server_exit_by_themselves_when_the_caller_dies(tmp_path):
    import subprocess
    import sys

    script = ("import sys, rank_bodies, ddp_lab\n"
              f"ddp_lab.launch(rank_bodies.write_pid_and_hang, {str(tmp_path)!r}, timeout=60)\n")
    # a caller killed by SIGKILL cannot remove its launch folder: it goes in this test's own
    # temporary folder, not /tmp (what is tested is that the ranks and the server exit)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TMPDIR=str(tmp_path))
    caller = subprocess.Popen([sys.executable, "-c", script], env=env)
    deadline = time.time() + 60
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.time() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    caller.kill()
    caller.wait()
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)


def test_restart_clock_counts_the_timeout_from_after_a_long_set_up():
    # 3 s of set-up, then 3 s more: 6 s in all, past the 5 s timeout, ok only because the clock
    # restarted (2 s of margin each side, for a loaded machine)
    result = launch(body.set_up_then_sleep, 3.0, 3.0, world_size=2, timeout=5)
    assert result.status == "ok" and [r.value for r in result.ranks] == [True, True]


def test_restart_clock_with_seconds_bounds_what_follows_the_set_up():
    start = time.time()
    result = launch(body.set_up_then_hang, world_size=2, timeout=30)
    assert result.status == "timeout" and "set_up_then_hang" in result.ranks[0].stack
    assert time.time() - start < 15  # set-up 2 s + budget 1 s, not the launch's 30 s
