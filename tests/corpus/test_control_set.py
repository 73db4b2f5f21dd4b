"""watch on the control set (tests/corpus/control/<shape>/, issue 44): correct scripts in the shape
of public training scripts people run (pytorch/examples' DDP tutorial, minGPT, FSDP2 with its
resume, tensor and sequence parallel with init_device_mesh, nanoGPT eager and compiled,
build-nanogpt, LLMs-from-scratch), each run as `ddp-lab watch` runs it: no error or warning on
a correct run; each variant with a real upstream bug (cited) caught at its fault line. A run
watch is known to get wrong says so in case.toml (`false_alarm` / `missed`), and its test fails
the day it is right, so the note goes."""
import pytest

from conftest import corpus_score

score = corpus_score()
RUNS = {f"{r.shape}/{r.label.replace(' ', '-')}": r for r in score.control_runs()}


def _param(key):
    run = RUNS[key]
    why = run.table.get("missed" if run.is_bug else "false_alarm")
    return pytest.param(key, marks=[pytest.mark.xfail(reason=why, strict=True)] if why else [])


def test_the_control_set_is_whole():
    shapes = {r.shape for r in RUNS.values()}
    assert len(shapes) >= 10 and sum(r.is_bug for r in RUNS.values()) >= 10, sorted(shapes)
    for run in RUNS.values():
        if run.is_bug:
            run.fault_line()  # raises unless `fault` is on exactly one line
            assert run.table["cites"] and all(c.startswith("https://") for c in run.table["cites"])


@pytest.mark.parametrize("key", [_param(k) for k in sorted(k for k, r in RUNS.items() if not r.is_bug)])
def test_a_correct_script_gives_no_error_or_warning(key):
    ok, seen = score.control_verdict(RUNS[key])
    assert ok, f"{key}: {seen}"


@pytest.mark.parametrize("key", [_param(k) for k in sorted(k for k, r in RUNS.items() if r.is_bug)])
def test_an_upstream_bug_is_caught_at_its_line(key):
    ok, seen = score.control_verdict(RUNS[key])
    assert ok, f"{key}: {seen or 'nothing at error or warning'}"
