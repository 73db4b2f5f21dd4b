"""The `ddp-lab` command: list, run, tour, bad input; and one scenario under torchrun."""
import os
import subprocess
import sys

import pytest

from ddp_lab.cli import main

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]


def test_list_names_every_lesson(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "00  Launching ranks" in out and "source_example" in out


def test_help_prints_the_whole_description_and_every_part_adds_its_commands(capsys):
    from ddp_lab import cli

    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert " ".join(cli.DESCRIPTION.split()) in out and cli.DESCRIPTION.endswith(".")
    sub = [a for a in cli.build_parser()._actions if a.dest == "command"][0]
    assert list(sub.choices) == ["list", "run", "tour", "build-ops", "check", "workshop", "site",
                                 "doctor", "watch"]
    assert all(callable(part.add_commands) for part in cli.PARTS)


def test_run_checks_each_variant_against_its_declaration(capsys):
    assert main(["run", "00", "rank_exits"]) == 0
    out = capsys.readouterr().out
    assert "rank 1: crashed  exited with status 3" in out
    assert out.count("as declared") == 2 and "NOT" not in out


def test_run_exits_nonzero_when_an_outcome_differs(capsys):
    # On 1 rank there is no peer to wait for: the hang of rank 0's lone all_reduce disappears.
    assert main(["run", "00", "collective_on_one_rank", "--variant", "broken", "--world-size", "1"]) == 1
    assert "NOT as declared" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["run", "99"], "no lesson '99'"),
    (["run", "00", "nope"], "has no scenario 'nope'"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_tour_prints_its_table_and_writes_figures(tmp_path, capsys):
    assert main(["tour", "--lesson", "00", "--out", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "lesson scenario" in out and "4/4 scenarios as declared" in out
    png = tmp_path / "00_source_example_losses.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_scenario_runs_unchanged_under_torchrun(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    proc = subprocess.run(TORCHRUN + ["-m", "ddp_lab", "run", "00", "source_example", "--variant", "fixed"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[rank 0] 00/source_example fixed: ok" in proc.stdout
    assert "[rank 1] 00/source_example fixed: ok" in proc.stdout


def test_a_broken_scenario_fails_under_torchrun_as_it_does_under_launch(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(TORCHRUN + ["-m", "ddp_lab", "run", "00", "source_example", "--variant", "broken"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert "[rank 0] 00/source_example broken: error NameError: name 'nn' is not defined" in proc.stdout
    assert proc.returncode == 0  # the broken variant failed exactly as declared
