"""Lesson 17 beyond the registry's declarations: the port job B could not bind is job A's; how
long each failure takes (bounded, never the default); the shards and GPUs of two nodes; the steps
each attempt of an elastic restart ran, and torchrun's own restart failing on this build; the
resume bit for bit; the file a kill leaves; the cache race; the scenarios that refuse to run under
torchrun; the figures and the exercise checker.

The generic test (tests/test_registry.py) runs every scenario broken and fixed against its
declaration; the runs are shared through the `runs` fixture."""
from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import timedelta

import pytest
import torch.distributed.constants

from ddp_lab.course.exercise import try_fix
from ddp_lab.lessons import l17_start_restart_resume as l17
from ddp_lab.course.registry import Expect, Variant, get_lesson

LESSON = get_lesson("17")


def test_job_b_fails_at_once_on_the_port_job_a_holds(runs, no_leftovers):
    broken, fixed = runs("two_jobs_one_port", "broken"), runs("two_jobs_one_port", "fixed")
    rank0 = broken.ranks[0]
    held = re.search(r"job A's store: port (\d+)", rank0.stdout).group(1)
    assert f"port: {held}, useIpv6: false, code: -98, name: EADDRINUSE" in rank0.error.message
    assert l17.ended_after(rank0) < 10  # the bind fails at once; no timeout is involved
    assert broken.ranks[1].is_collateral  # job A's other rank only lost its peer
    ports = fixed.ranks[0].value
    assert ports["second_port"] != ports["first_port"]


def test_an_address_never_reached_fails_after_the_short_timeout_and_says_where(runs, no_leftovers):
    broken = runs("unreachable_address", "broken")
    for r in broken.ranks:
        assert "while trying to connect to (192.0.2.1, " in r.error.message
        assert 0.9 < l17.ended_after(r) < 10  # 1 s asked for: the client retries once, then gives up
    # what a script that gives no timeout would wait: torch's own default (gloo; NCCL's is 10 min)
    assert torch.distributed.constants.default_pg_timeout == timedelta(minutes=30)


def test_a_peer_that_never_came_is_told_apart_by_the_message(no_leftovers):
    run = l17.PEER_NEVER_CAME.run()
    l17.PEER_NEVER_CAME.expect.assert_met(run)
    message = run.ranks[0].error.message
    assert "while trying to connect" not in message and message.endswith("/1")  # rank 1's key
    assert run.ranks[1].value == {"joined": False}


def test_two_nodes_count_local_ranks_twice(runs, no_leftovers):
    broken, fixed = runs("ranks_per_node", "broken").values[0], runs("ranks_per_node", "fixed").values[0]
    by_rank = sorted(broken["workers"], key=lambda w: w["rank"])
    assert [(w["node"], w["local_rank"]) for w in by_rank] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [w["shard"] for w in by_rank] == [0, 1, 0, 1] and [w["gpu"] for w in by_rank] == [0, 1, 2, 3]
    assert (broken["duplicated"], broken["never_seen"]) == (0.5, 0.5)
    fixed_by_rank = sorted(fixed["workers"], key=lambda w: w["rank"])
    assert [w["shard"] for w in fixed_by_rank] == [0, 1, 2, 3] and [w["gpu"] for w in fixed_by_rank] == [0, 1, 0, 1]
    assert (fixed["duplicated"], fixed["never_seen"]) == (0.0, 0.0)


def test_an_elastic_restart_restarts_every_rank_and_reruns_what_was_not_saved(runs, no_leftovers):
    broken, fixed = runs("elastic_restart", "broken").values[0], runs("elastic_restart", "fixed").values[0]
    first, again, resumed = list(range(5)), list(range(8)), list(range(4, 8))
    assert broken["steps"] == {"0/0": first, "0/1": first, "1/0": again, "1/1": again}
    assert fixed["steps"] == {"0/0": first, "0/1": first, "1/0": resumed, "1/1": resumed}
    assert (broken["repeated"], fixed["repeated"]) == (5, 1)
    # with the store not shared, each attempt's workers find no key of theirs before they join
    assert set(broken["stale_keys"].values()) == set(fixed["stale_keys"].values()) == {False}


def test_torchruns_workers_go_when_the_launcher_stops_the_agents_rank(no_leftovers, tmp_path):
    # the launcher kills the rank (and with it torchrun's agent) mid-job; the workers, in sessions
    # of their own, follow it through PR_SET_PDEATHSIG; the job's folder (made by the killed rank)
    # goes with the launch's scratch folder (issue 47: it was left in /tmp)
    from temp_entries import temp_folder_of_its_own

    variant = LESSON.scenario("elastic_restart").fixed
    with temp_folder_of_its_own(tmp_path) as env:
        run = replace(variant, env={**variant.env, **env}).run(timeout=1.0, steps=10**6)  # still training
    assert run.status == "timeout", run.describe_failure()


def test_torchruns_own_store_still_holds_the_first_attempts_addresses_at_the_restart(no_leftovers):
    run = l17.restart_with_torchruns_defaults()
    assert l17.restart_found_old_keys(run) == []
    assert l17.keys_at_start(run.ranks[0]) == {"0/0": False, "0/1": False, "1/0": True, "1/1": True}


def test_the_full_resume_is_the_straight_run_bit_for_bit(runs):
    broken, fixed = runs("partial_resume", "broken"), runs("partial_resume", "fixed")
    straight, first = (r.values[0]["losses"] for r in fixed.earlier)
    assert first == straight[:10]  # the same job up to the checkpoint, on this machine exactly
    assert fixed.values[0]["losses"] == straight[10:] and fixed.values[0]["departure"] == 0.0
    assert broken.values[0]["departure"] > 1e-3 and broken.values[0]["losses"][0] != straight[10]
    assert fixed.earlier[1].values[0]["saved"] == [
        "epoch", "model", "optimizer", "position", "rng", "scheduler", "step"]


def test_a_kill_mid_write_leaves_half_a_checkpoint(runs, no_leftovers):
    broken, fixed = runs("torn_checkpoint", "broken"), runs("torn_checkpoint", "fixed")
    assert [r.headline for r in broken.earlier[0].ranks][0] == "killed by SIGXFSZ"
    assert all("there is a high likelihood that your checkpoint file is corrupted" in r.error.message
               for r in broken.ranks)
    files = fixed.values[0]["files"]
    assert list(files) == ["ckpt-2.pt", "ckpt-4.pt", "ckpt-6.pt.tmp"]
    assert files["ckpt-6.pt.tmp"] == files["ckpt-4.pt"] // 2  # cut where the kernel stopped it


def test_resuming_from_the_newest_file_that_loads_is_enough_on_its_own(no_leftovers):
    fixed = LESSON.scenario("torn_checkpoint").fixed
    run = fixed.run(save=l17.save_in_place)  # the torn file keeps its final name this time
    fixed.assert_declared(run)
    assert run.values[0]["resumed_from"] == 4 and "ckpt-6.pt" in run.values[0]["files"]


def test_a_script_of_ones_own_sees_the_write_fail_and_is_left_the_same_torn_file(no_leftovers):
    # CPython ignores SIGXFSZ from the start; only scenario 6's own line makes the kernel kill
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    run, left = l17.cut_with_pythons_handler()
    l17.WRITE_FAILS.expect.assert_met(run)
    assert run.ranks[0].status == "error" and run.ranks[1].is_collateral  # rank 0 lived to raise
    assert list(left) == ["ckpt-2.pt", "ckpt-4.pt", "ckpt-6.pt"]
    assert left["ckpt-6.pt"] == left["ckpt-4.pt"] // 2  # cut at the same limit, under its final name


def test_every_rank_building_one_cache_races(runs):
    broken, fixed = runs("every_rank_prepares", "broken").values[0], runs("every_rank_prepares", "fixed").values[0]
    assert broken["raced"] >= 1 and broken["builds"] >= broken["rounds"]
    # what a torn cache gives depends on where the other rank's write was: seen here, EOFError
    # (empty), "failed finding central directory", "not a ZIP archive", weights-only refusals
    assert {e.split(":")[0] for e in broken["errors"]} <= {"EOFError", "RuntimeError", "UnpicklingError"}, broken["errors"]
    assert (fixed["builds"], fixed["torn_loads"], fixed["errors"]) == (fixed["rounds"], 0, [])


REFUSED = {"two_jobs_one_port": "it starts torchrun itself", "ranks_per_node": "it starts torchrun itself",
           "elastic_restart": "it starts torchrun itself",
           "partial_resume": "its restart is a new launch, new processes",
           "torn_checkpoint": "it kills the rank that writes"}


def _under_torchrun(tmp_path, *cli) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                           "-m", "ddp_lab", "run", "17", *cli],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)


@pytest.mark.slow
def test_under_torchrun_the_cache_scenario_runs_and_a_restart_scenario_says_why_not(tmp_path, no_leftovers):
    ran = _under_torchrun(tmp_path, "every_rank_prepares", "--variant", "fixed")
    assert ran.returncode == 0, ran.stdout + ran.stderr[-2000:]
    refused = _under_torchrun(tmp_path, "torn_checkpoint", "--variant", "fixed")
    assert refused.returncode != 0
    for rank in (0, 1):
        assert f"[rank {rank}] 17/every_rank_prepares fixed: ok ok" in ran.stdout
        assert (f"[rank {rank}] 17/torn_checkpoint fixed: error RuntimeError: 17/torn_checkpoint cannot "
                f"run under torchrun: {REFUSED['torn_checkpoint']}") in refused.stdout, refused.stdout


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_the_scenarios_that_cannot_run_under_torchrun_say_why_and_what_to_run(name, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # what torchrun gives its workers
    monkeypatch.delenv("DDP_LAB_RANK_PROCESS", raising=False)  # and the launcher its ranks
    variant = LESSON.scenario(name).fixed
    restarted = isinstance(variant, l17.Restarted)
    first = variant.before[0] if restarted else variant
    with pytest.raises(RuntimeError, match=rf"17/{name} cannot run under torchrun: {REFUSED[name]}.*"
                                           rf"Run it with `ddp-lab run 17 {name}`"):
        first.fn(**first.kwargs, **({"workdir": "unused"} if restarted else {}))


def test_the_figures_draw_both_runs(runs):
    figs = LESSON.figures({name: {w: runs(name, w) for w in ("broken", "fixed")}
                           for name in ("partial_resume", "elastic_restart")})
    assert set(figs) == {"resume_losses", "elastic_restart"}
    (ax,) = figs["resume_losses"].axes
    assert [line.get_label() for line in ax.get_lines()][:3] == [
        "straight run (no restart)", "resumed from the model only", "resumed from everything (equal, bit for bit)"]
    left, right = figs["elastic_restart"].axes
    assert "5 steps run twice" in left.get_title() and "1 step run twice" in right.get_title()


def test_the_exercise_checker_fails_a_partial_state_and_passes_the_full_one():
    def model_and_optimizer(job):
        return {"model": job.model.module.state_dict(), "optimizer": job.opt.state_dict()}

    def this_ranks_generators_only(job):  # the exercise's words read too literally (issue 38)
        return {**l17.everything(job), "rng": l17.rng_state()}

    scenario = LESSON.scenario("partial_resume")
    partial = try_fix(scenario, state_of=model_and_optimizer)
    assert not partial.passed
    assert l17.what_the_checkpoint_lacks(partial) == "the checkpoint lacks: scheduler, step, epoch, position, rng"
    literal = try_fix(scenario, state_of=this_ranks_generators_only)
    assert not literal.passed and literal.result.status == "error"
    assert l17.what_the_checkpoint_lacks(literal).startswith(
        "rank 0: TypeError: the checkpoint's \"rng\" is a dict, one rank's generators (rng_state()); "
        "restore expects a list, one entry per rank (2), rank r taking entry r: save gather(rng_state())")
    full = try_fix(scenario, state_of=l17.everything)
    assert full.passed and l17.what_the_checkpoint_lacks(full) == "every key is there"
    assert set(l17.FULL_STATE) == set(full.result.earlier[1].values[0]["saved"])


def test_under_torchrun_a_wrong_endpoint_waits_out_the_rendezvous_timeouts_not_the_groups(tmp_path):
    # what notebook 17 says (Going further): the c10d store's read_timeout bounds the connect, then
    # RendezvousConnectionError; its defaults, and torchrun's for the static rendezvous
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout
    from torch.distributed.launcher.api import LaunchConfig

    assert RendezvousTimeout().join == timedelta(seconds=600)
    assert LaunchConfig(min_nodes=2, max_nodes=2, nproc_per_node=1).rdzv_configs["timeout"] == 900
    assert '"read_timeout", 60)' in inspect.getsource(c10d._create_tcp_store)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "MASTER_", "RANK"))}
    (tmp_path / "w.py").write_text("print('a worker ran')\n")
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                          "--rdzv-backend=c10d", f"--rdzv-endpoint={l17.UNREACHABLE}:29400",
                          "--rdzv-conf=read_timeout=2", str(tmp_path / "w.py")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    took = time.monotonic() - began
    assert out.returncode != 0 and "a worker ran" not in out.stdout
    assert "RendezvousConnectionError: The connection to the C10d store has failed" in out.stderr
    assert f"timed out after 2000ms while trying to connect to ({l17.UNREACHABLE}, 29400)" in out.stderr
    assert took < 60, took  # the 2 s asked for (plus torchrun's start), not the group's 30 minutes
