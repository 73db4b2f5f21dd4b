"""`ddp-lab check`: the attendees' pre-flight check."""
import os
import sys

from ddp_lab.kit import preflight
from ddp_lab.cli import main


def test_check_passes_here_with_one_line_per_check(capsys):
    assert main(["check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l.split()[1] for l in lines[:-1]] == ["python", "torch", "two", "deepspeed", "jupyterlab", "ipywidgets",
                                                  "kernel", "users"]
    # "users" warns where other people use this machine (it never fails the check)
    assert all(l.startswith(("ok", "warn")) for l in lines[:-1]) and lines[-1].startswith("all checks passed")
    assert "all_reduce gave 3.0 on both, in" in lines[2]


def test_a_failing_check_fails_the_whole_check_and_says_the_fix():
    printed = []
    rc = preflight.preflight([preflight.python_version, lambda: preflight.Item("thing", False, "missing", "install it")],
                              out=printed.append)
    assert rc == 1
    assert printed[1] == "FAIL  thing        missing\n      fix: install it"
    assert printed[-1] == "1 check(s) failed"


def test_a_kernel_that_cannot_import_the_course_is_named(monkeypatch):
    monkeypatch.setattr(preflight, "kernel_python", lambda: ("Python 3 (ipykernel)", sys.executable))
    monkeypatch.setattr(preflight, "KERNEL_IMPORTS", ("json", "no_such_module_ddp_lab_test"))
    result = preflight.notebook_kernel()
    assert not result.ok
    assert result.detail.endswith("lacks: no_such_module_ddp_lab_test") and "pip install" in result.fix


def test_torch_release_parsing():
    assert preflight._release("2.13.0+cpu") == (2, 13, 0)
    assert preflight._release("2.4.0a0+git123") == (2, 4, 0)


def test_an_unbuilt_deepspeed_op_fails_the_check_and_names_build_ops(tmp_path, monkeypatch, capsys):
    """An empty TORCH_EXTENSIONS_DIR: lesson 12 would fail with OpBuildError, so check must not
    say "ready"; here gcc and the Python headers are present, so the fix is build-ops alone."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert main(["check"]) == 1
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, l in enumerate(lines) if l.split()[1] == "deepspeed")
    assert lines[at].startswith("FAIL") and "not built in" in lines[at] and str(tmp_path) in lines[at]
    assert "gcc/g++ and the Python headers are here" in lines[at]
    assert lines[at + 1].strip() == "fix: ddp-lab build-ops (once, a few minutes)"
    assert lines[-1] == "1 check(s) failed" and not any("all checks passed" in l for l in lines)


def test_without_a_compiler_or_python_headers_the_check_names_them(tmp_path, monkeypatch):
    from ddp_lab.instruments import deepspeed_ops

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler-ddp-lab")
    monkeypatch.setattr(deepspeed_ops.sysconfig, "get_paths", lambda: {"include": str(tmp_path / "no-include")})
    result = preflight.deepspeed_op()
    assert not result.ok and "cannot build it yet" in result.detail
    assert "install gcc/g++" in result.fix and "install python3-dev" in result.fix
    assert result.fix.endswith("then ddp-lab build-ops (once, a few minutes)")


def test_a_killed_build_lock_fails_the_check_where_the_lock_is_a_baton(tmp_path, monkeypatch):
    import os

    from ddp_lab.instruments.deepspeed_ops import build_dir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = build_dir() / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (1, 1))  # old, and no process builds there: a dead build's
    result = preflight.deepspeed_op()
    from ddp_lab.instruments.deepspeed_ops import lock_is_a_baton

    if lock_is_a_baton():  # torch <= 2.13: every later build would wait on it
        assert not result.ok and str(lock) in result.detail and result.fix.startswith("ddp-lab build-ops")
    else:  # torch >= 2.14: an OS advisory lock, the file stays after every build by design
        assert not result.ok and "killed build" not in result.detail, result.detail
        assert "op is not built" in result.detail and result.fix.startswith("ddp-lab build-ops")


def test_an_op_that_does_not_load_with_this_torch_is_named(tmp_path, monkeypatch):
    from ddp_lab.instruments.deepspeed_ops import build_dir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = build_dir()
    folder.mkdir(parents=True)
    (folder / "deepspeed_shm_comm.so").write_bytes(b"not a shared object")
    result = preflight.deepspeed_op()
    assert not result.ok and "does not load with this torch/Python" in result.detail
    assert result.fix == f"rm -r {folder} && ddp-lab build-ops"


def test_an_op_ninja_would_rebuild_fails_the_check(tmp_path, monkeypatch):
    """Issue 47: an op whose build is out of date would be rebuilt by the first rank to load it."""
    from ddp_lab.instruments import deepspeed_ops

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = deepspeed_ops.build_dir()
    folder.mkdir(parents=True)
    (folder / "deepspeed_shm_comm.so").write_bytes(b"")
    monkeypatch.setattr(deepspeed_ops, "out_of_date", lambda folder=None: "2 build step(s) to redo")
    result = preflight.deepspeed_op()
    assert not result.ok and "out of date (2 build step(s) to redo)" in result.detail
    assert result.fix.startswith("ddp-lab build-ops")


def _utmp(tmp_path, *sessions):
    """A utmp file holding one record per (type, user)."""
    path = tmp_path / "utmp"
    path.write_bytes(b"".join(preflight.UTMP.pack(kind, 100 + i, b"pts/0", b"ts/0", user.encode(),
                                                  b"", 0, 0, 0, 0, 0, 0, 0, 0, 0, b"")
                              for i, (kind, user) in enumerate(sessions)))
    return str(path)


def test_utmp_is_read_as_who_reads_it(tmp_path):
    assert preflight.UTMP.size == 384  # glibc's struct utmp on Linux
    path = _utmp(tmp_path, (preflight.USER_PROCESS, "alice"), (8, "bob"), (preflight.USER_PROCESS, "carol"))
    assert preflight.utmp_users([str(tmp_path / "none"), path]) == {"alice", "carol"}  # bob's session ended
    assert preflight.utmp_users([str(tmp_path / "none")]) == set()  # a container without utmp


def test_other_users_are_a_warning_from_utmp_or_from_process_owners(monkeypatch):
    me = preflight._name(os.getuid())
    alone = preflight.other_users(lambda: {me}, lambda: {0, os.getuid(), 65534})
    assert alone.ok and not alone.warn and alone.line().startswith("ok    users        no other user")
    logged_in = preflight.other_users(lambda: {me, "alice"}, lambda: {os.getuid()})
    assert logged_in.ok and logged_in.warn and "1 other user(s) on this machine: alice" in logged_in.detail
    # no utmp (a container): the owners of processes still show who is here; system uids do not
    monkeypatch.setattr(preflight, "_uid_min", lambda: 1000)
    owners = preflight.other_users(set, lambda: {0, 999, os.getuid(), 4242424})
    assert owners.warn and owners.detail.endswith(": uid 4242424")
    assert owners.line().splitlines()[0].startswith("warn  users")
    assert "without a password" in owners.line().splitlines()[1] and "On a shared node" in owners.fix
    printed = []
    assert preflight.preflight([lambda: owners], out=printed.append) == 0  # a warning passes


def test_process_owners_reads_proc():
    assert os.getuid() in preflight.process_owners()  # this process, at least
