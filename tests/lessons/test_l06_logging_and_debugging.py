"""Lesson 06 beyond the registry's declarations: what each debug level reveals (measured), C++
logs, torchrun's report of the same failure, the console against the records, the stacks of
the stuck ranks, the straggler's numbers and picture, and the exercise checker.

The generic test (tests/course/test_registry.py) runs every scenario broken and fixed against its
declaration; here each distributed test is a public test plus the lesson's per-rank function."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, scenario_run  # one run a session, a notebook's where it made it
from ddp_lab import launch
from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l06_logging_and_debugging as l06
from ddp_lab.course.registry import get_lesson


LESSON = get_lesson("06")


def _nothing() -> None:
    return None


@pytest.fixture(scope="module", autouse=True)
def warm_fork_server():
    """A launch's clock starts before a cold fork server is up: start it before the 3 s hang."""
    launch(_nothing, world_size=1, timeout=120).raise_for_status()


@pytest.fixture(scope="module")
def levels():
    runs = {level: variant.run() for level, variant in l06.DEBUG_LEVELS.items()}
    for level, run in runs.items():
        l06.DEBUG_LEVELS[level].expect.assert_met(run), level
    return {level: l06.debug_summary(run) for level, run in runs.items()}


def test_detail_crashes_ddp_even_on_a_model_without_the_bug():
    scenario = LESSON.scenario("debug_detail")
    assert scenario.broken.kwargs["model_cls"] is l06.BothHeads
    run = l06.DEBUG_LEVELS["INFO"].run(model_cls=l06.BothHeads)  # INFO, same model: fine
    assert run.ok


def test_off_gives_indices_info_gives_names_detail_crashes(levels):
    assert (levels["OFF"]["names"], levels["OFF"]["indices"]) == ([], ["2", "3"])
    assert levels["INFO"]["names"] == ["aux_head.bias", "aux_head.weight"]
    assert (levels["DETAIL"]["status"], levels["DETAIL"]["signal"], levels["DETAIL"]["names"]) == \
        ("crashed", "SIGSEGV", [])
    assert levels["DETAIL after init"]["names"] == ["aux_head.bias", "aux_head.weight"]


def test_detail_set_after_init_runs_ddp_at_level_detail(runs):
    assert [v["debug_level"] for v in runs("debug_detail", "fixed").values] == ["DETAIL", "DETAIL"]


def test_detail_checks_collectives_only_when_the_group_is_created_under_it(no_leftovers):
    created, late = (variant.run() for variant in l06.DETAIL_COLLECTIVES.values())
    l06.DETAIL_COLLECTIVES["DETAIL at creation"].expect.assert_met(created)
    l06.DETAIL_COLLECTIVES["DETAIL after init"].expect.assert_met(late)
    assert "OpType=BROADCAST" in created.ranks[0].error.message
    assert [r.stuck_in() for r in late.ranks] == ["all_reduce()", "broadcast()"]
    # the notebook's exercise, solved: the innermost frame in torch.distributed's collectives
    assert [_collective_of(r.stack) for r in late.ranks] == ["all_reduce", "broadcast"]


def _collective_of(stack):
    for path, func in re.findall(r'File "([^"]+)", line \d+ in (\w+)', stack):
        if path.endswith("torch/distributed/distributed_c10d.py"):
            return func
    return None


@pytest.mark.slow
def test_the_repro_script_crashes_only_when_the_group_is_created_under_detail():
    script = REPO / "tools" / "repro_detail_ddp_segfault.py"
    crash = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    after = subprocess.run([sys.executable, str(script), "--after"], capture_output=True, text=True,
                           timeout=120)
    assert crash.returncode == 1 and "(SIGSEGV)" in crash.stdout, crash.stdout + crash.stderr
    assert after.returncode == 0 and "DDP built, one step done" in after.stdout, after.stdout + after.stderr


def test_cpp_log_level_adds_lines_that_name_the_parameters_too(levels, no_leftovers):
    run = l06.CPP_LOG.run()
    l06.CPP_LOG.expect.assert_met(run)
    cpp = l06.debug_summary(run)
    assert cpp["names"] == ["aux_head.bias", "aux_head.weight"]
    assert cpp["cpp_log_lines"] >= 3 and levels["INFO"]["cpp_log_lines"] == 0
    assert cpp["stderr_lines"] > levels["INFO"]["stderr_lines"] + 10  # DDP's whole configuration


def test_cpp_log_level_set_after_torch_was_imported_does_nothing():
    run = l06.CPP_LOG_TOO_LATE.run()
    l06.CPP_LOG_TOO_LATE.expect.assert_met(run)
    assert l06.debug_summary(run)["cpp_log_lines"] == 0


def test_torchrun_reports_the_same_failure(no_leftovers):
    run = l06.TORCHRUN.run()
    l06.TORCHRUN.expect.assert_met(run)
    report = l06.torchrun_failures(run.ranks[0].error.message)
    assert report["failures"][1] == {"exitcode": 1, "error": "IndexError: index out of range in self"}
    assert l06.is_collateral(report["failures"][0])
    assert report["root_cause"] in (0, 1)  # whole-second timestamps: a tie names the lower rank


def test_torchrun_summary_parser_on_a_known_message():
    message = ("\n====\nx.py FAILED\n----\nFailures:\n  <NO_OTHER_FAILURES>\n----\n"
               "Root Cause (first observed failure):\n[0]:\n  time      : 2024-01-01_00:00:00\n"
               "  host      : h\n  rank      : 3 (local_rank: 1)\n  exitcode  : 1 (pid: 7)\n"
               "  error_file: <N/A>\n  traceback : To enable traceback see: https://x\n====\n")
    assert l06.torchrun_failures(message) == {
        "failures": {3: {"exitcode": 1, "error": "traceback : To enable traceback see: https://x"}},
        "root_cause": 3}
    assert l06.is_collateral({"exitcode": -15, "error": ""})
    assert not l06.is_collateral({"exitcode": 1, "error": "IndexError: index out of range in self"})


def test_console_floods_then_only_rank0_speaks_and_every_rank_keeps_a_record():
    scenario = LESSON.scenario("every_rank_prints")
    broken, fixed = scenario_run(scenario, "broken"), scenario_run(scenario, "fixed")
    assert l06.console_summary(broken) == {"lines": 16, "distinct": 14, "say_which_rank": 0,
                                           "records": [0, 0]}
    assert l06.console_summary(fixed) == {"lines": 4, "distinct": 4, "say_which_rank": 0,
                                          "records": [4, 4]}


def _print_on_rank0(log, text):
    from ddp_lab import rank_info

    if rank_info().is_main:
        print(text)


def test_checker_wants_every_rank_on_record():
    verdict = try_fix(LESSON.scenario("every_rank_prints"), report=_print_on_rank0)
    assert not verdict.passed
    assert verdict.problems == ["rank 0's record holds 0 messages, expected 4",
                                "rank 1's record holds 0 messages, expected 4"]
    assert try_fix(LESSON.scenario("every_rank_prints"), report=l06.rank_log).passed


def test_straggler_makes_rank0_wait_every_step_and_the_figure_shows_it():
    scenario = LESSON.scenario("straggler")
    runs = {which: scenario_run(scenario, which) for which in ("broken", "fixed")}
    broken_steps = l06.step_times(runs["broken"])
    assert [len(s) for s in broken_steps] == [4, 4]
    assert min(min(s) for s in broken_steps) > 0.1  # 0.15 s of loading on rank 1 sets the pace
    assert runs["broken"].values[1]["wait_s"] < runs["broken"].values[0]["wait_s"] / 3
    fig = LESSON.figures({"straggler": runs})["straggler_timeline"]
    for ax in fig.axes[:2]:
        assert ax.get_xlabel() == "time since the ranks aligned (s)"
        assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert fig.axes[0].get_title().startswith("broken: rank 0: ")


def test_stuck_ranks_are_named_by_their_stacks(runs):
    run = runs("stuck_ranks", "broken")
    assert [r.stuck_in() for r in run.ranks] == ["barrier()", "wait_for_file()"]
    assert "prepare_then_share" in run.ranks[1].stack_summary()
    assert [_collective_of(r.stack) for r in run.ranks] == ["barrier", None]


def test_the_shared_file_lives_in_a_private_folder_with_an_unguessable_name(tmp_path):
    """Rank 0 makes its folder with mkdtemp (issue 38, point 16): 0700, a random name, in the
    launch's scratch folder. The hung variant's ranks are killed before they reach their cleanup;
    the launcher removes the folder anyway (issue 47: it was left in /tmp, empty)."""
    from temp_entries import temp_folder_of_its_own

    ours = lambda: list(tmp_path.glob("ddp-lab-*/*/scratch/ddp-lab-l06-*"))  # noqa: E731
    seen, ended = [], threading.Event()

    def watch():  # the folder, while the hung ranks wait
        while not seen and not ended.is_set():
            seen.extend((p.name, p.stat().st_mode & 0o777) for p in ours())
            time.sleep(0.02)

    with temp_folder_of_its_own(tmp_path) as env:
        launch(l06.prepare_then_share, barrier_first=False, env=env, timeout=60).raise_for_status()
        watcher = threading.Thread(target=watch)
        watcher.start()
        hung = launch(l06.prepare_then_share, barrier_first=True, env=env, timeout=3)
        ended.set()
        watcher.join()
    assert hung.status == "timeout"
    (name, mode), = seen[:1]
    assert re.fullmatch(r"ddp-lab-l06-[\w]{8}", name) and mode == 0o700


def test_token_batches_hold_eos_only_on_the_bad_rank_and_step():
    assert (l06.token_batch(1, 1, bad_rank=1) == l06.EOS).sum() == 1
    assert (l06.token_batch(0, 1, bad_rank=1) == l06.EOS).sum() == 0
    assert (l06.token_batch(1, 0, bad_rank=1) == l06.EOS).sum() == 0


def test_the_runs_that_create_the_group_under_detail_start_from_fresh_processes():
    """Issue 47: DETAIL's crash reads memory that is not the checker's, so on torch 2.14.1 it
    came or not by what the process had done before: forked from the fork server after the
    tour's earlier lessons, 0 of 10 runs crashed; spawned, 10 of 10. Those runs spawn."""
    assert LESSON.scenario("debug_detail").broken.start_method == "spawn"
    assert l06.DEBUG_LEVELS["DETAIL"].start_method == "spawn"
    assert all(v.start_method == "auto" for k, v in l06.DEBUG_LEVELS.items() if k != "DETAIL")
