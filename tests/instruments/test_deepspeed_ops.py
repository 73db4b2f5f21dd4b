"""DeepSpeed's C++ op is built once, explicitly (`ddp-lab build-ops`), never inside a rank:
a rank finds it unbuilt or blocked by a dead build's lock and says so at once; a dead build's
lock is told from a live build's and removed; a missing compiler is named; each environment has
its folder, and an op ninja would rebuild is refused in the rank too. Every test points
TORCH_EXTENSIONS_DIR at a temporary folder: the machine's own build is never touched.

The lock differs by torch: up to 2.13 its existence blocks (a baton, which a killed build leaves
behind); from 2.14 torch holds an OS advisory lock on it, and the file stays by design. The
tests of each kind skip, saying so, on a torch of the other kind."""
import fcntl
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ddp_lab.instruments import deepspeed_ops as ops
from ddp_lab.lessons import l12_sharded_modules as l12


@pytest.fixture
def ext_dir(tmp_path, monkeypatch):
    """The op's folder under a TORCH_EXTENSIONS_DIR of the test's own."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = ops.build_dir()
    folder.mkdir(parents=True)
    return folder


BATON = pytest.mark.skipif(not ops.lock_is_a_baton(), reason="this torch holds an OS advisory "
                           "lock on the file (torch >= 2.14): a leftover file is never stale")
ADVISORY = pytest.mark.skipif(ops.lock_is_a_baton(), reason="this torch's lock file is a baton "
                              "(torch <= 2.13): its existence blocks")


def _held(lock) -> bool:
    """Whether some process holds an advisory lock on `lock`."""
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _old_lock(folder, age=120):
    lock = folder / "lock"
    lock.touch()
    os.utime(lock, (time.time() - age, time.time() - age))
    return lock


def test_build_dir_honours_torch_extensions_dir(ext_dir, tmp_path):
    assert ext_dir.parent.parent == tmp_path and ext_dir.name == ops.NAME and not ops.is_built()
    assert re.fullmatch(r"py3\d+\w*_(cpu|cu\d+)-[0-9a-f]{10}", ext_dir.parent.name), ext_dir


def test_each_environment_torch_and_deepspeed_gets_a_folder_of_its_own(monkeypatch):
    """Issue 47: two environments with one torch shared torch's default folder, and each
    rewrote the other's build.ninja (its paths), so ninja rebuilt the op in the next rank."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    here = ops.build_dir()
    assert here.parent.parent == Path(sys.prefix) / "torch_extensions"
    depends = ops._depends_on()
    for what in ("environment", "torch", "deepspeed", "headers", "compiler", "ninja"):
        monkeypatch.setattr(ops, "_depends_on", lambda: {**depends, what: "another"})
        assert ops.build_dir() != here, what
    monkeypatch.setattr(ops, "_depends_on", lambda: dict(depends))
    assert ops.build_dir() == here


def test_a_rank_refuses_to_compile_the_op_and_the_run_says_what_to_run(ext_dir, tmp_path):
    """A real ZeRO-3 launch with the op unbuilt: every rank refuses at once (no timeout, no
    lock), and the registry makes it an error of the run, not a scenario's outcome."""
    variant = l12.LESSON.scenario("zero3_penalty").broken
    with pytest.raises(ops.OpBuildError, match=r"rank \d: .*is not built for this environment.*"
                                                r"Run `ddp-lab build-ops`"):
        replace(variant, env={"TORCH_EXTENSIONS_DIR": str(tmp_path)}).run(timeout=60)
    assert not (ext_dir / "lock").exists() and not ops.is_built()


def test_the_cli_says_it_as_an_error_of_the_run(ext_dir, tmp_path, capsys):
    from ddp_lab.cli import main

    assert main(["run", "12", "zero3_penalty", "--variant", "broken"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddp-lab: 12/zero3_penalty broken, rank ") and "ddp-lab build-ops" in err


def test_an_op_that_ninja_would_rebuild_is_refused_in_the_rank(ext_dir):
    """Built, then a source newer than the op (DeepSpeed or torch reinstalled in place): torch
    would run ninja, which rebuilds, inside the rank. The rank refuses; build-ops would rebuild."""
    source = ext_dir / "src.cpp"
    source.write_text("")
    (ext_dir / "build.ninja").write_text(f"rule cp\n  command = cp $in $out\nbuild {ops.NAME}.so: cp src.cpp\n")
    subprocess.run([ops._ninja(), "-C", str(ext_dir)], check=True, capture_output=True)  # built
    log = (ext_dir / ".ninja_log").read_bytes()
    ops.require_built()
    assert (ext_dir / ".ninja_log").read_bytes() == log  # asked of a copy: the log is untouched
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(ext_dir.parent)  # where the rank's torch looks
    assert ops.build_dir() == ext_dir  # and asked again, the same folder
    later = time.time() + 60
    os.utime(source, (later, later))
    with pytest.raises(ops.OpBuildError, match=r"out of date \(1 build step\(s\) to redo\).*ddp-lab build-ops"):
        ops.require_built()


@BATON
def test_a_dead_builds_lock_is_stale_and_named(ext_dir):
    lock = _old_lock(ext_dir)
    assert ops.stale_lock() == lock
    with pytest.raises(ops.OpBuildError, match="a build was killed and left .*lock"):
        ops.require_built()


def test_a_live_build_or_a_fresh_lock_is_not_stale(ext_dir):
    _old_lock(ext_dir)
    builder = subprocess.Popen(["sleep", "30"], cwd=ext_dir)  # as ninja runs, in the folder
    try:
        assert ops.stale_lock() is None
    finally:
        builder.kill()
        builder.wait()
    _old_lock(ext_dir, age=0)
    assert ops.stale_lock() is None


@BATON
def test_ensure_built_removes_a_dead_lock_and_keeps_a_built_op(ext_dir):
    (ext_dir / f"{ops.NAME}.so").write_bytes(b"")  # built earlier (not loaded here)
    _old_lock(ext_dir)
    said = []
    assert ops.ensure_built(say=said.append) is False
    assert not (ext_dir / "lock").exists()
    assert said and "left by a build that is no longer running" in said[0]
    ops.require_built()  # nothing left to complain about


@ADVISORY
def test_a_killed_builders_lock_is_released_and_its_file_is_normal(ext_dir):
    """torch's own FileLock held by a process that is then SIGKILLed, as a build killed by a
    launch's timeout would be: the kernel releases it, the file stays, nothing is stale, a built
    op loads and `ensure_built` neither rebuilds nor removes the file."""
    hold = ("import sys, time\nfrom torch.utils._filelock import FileLock\n"
            "with FileLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(ext_dir / "lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held" and _held(ext_dir / "lock")
    finally:
        holder.kill()
        holder.wait()
    lock = _old_lock(ext_dir)  # the killed holder's file, older than STALE_AFTER_S
    assert lock.exists() and not _held(lock) and ops.stale_lock() is None
    (ext_dir / f"{ops.NAME}.so").write_bytes(b"")  # built earlier (not loaded here)
    ops.require_built()
    said = []
    assert ops.ensure_built(say=said.append) is False and said == [] and lock.exists()


def test_a_missing_compiler_is_named_before_any_build(ext_dir, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(ops.OpBuildError, match=r"C\+\+ compiler .*install gcc/g\+\+"):
        ops.ensure_built(say=lambda line: None)
    assert list(ext_dir.iterdir()) == []


def test_a_build_past_its_time_limit_is_stopped_and_leaves_no_lock(ext_dir):
    """A real build into an empty folder, stopped after 3 s: killed with its compilers, its
    lock removed, the cause said; the next build is not blocked."""
    start = time.time()
    with pytest.raises(ops.OpBuildError, match="did not finish in 3 s; stopped it"):
        ops.ensure_built(timeout=3, say=lambda line: None)
    assert time.time() - start < 20
    lock = ext_dir / "lock"
    if ops.lock_is_a_baton():
        assert not lock.exists()
    else:  # the file stays by design; nobody holds the lock
        assert not lock.exists() or not _held(lock)
    assert not ops.is_built()
    time.sleep(2)  # a compiler that escaped would still be working in the folder
    assert ops._builders(ext_dir) == [] and not (ext_dir / "shm.o").exists()
