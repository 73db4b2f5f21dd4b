"""CUDA never poisons the fork server: `ddp_lab.cuda_init` counts GPUs without initialising
CUDA, names the code that first did (the watch), and tells whether a child forked now could use
CUDA; the fork server checks itself after every import and is replaced, with a warning naming
the module and line, when one initialised CUDA there.

What needs a CUDA build of torch (the pinned one is the CPU build, where nothing can poison a
fork) skips there with that reason; run this file in an environment with a CUDA build (docs/upgrading.md,
"Running the course on a new PyTorch") to check it for real, GPU or not."""
import importlib
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch

import ddp_lab
from ddp_lab.launching import cuda_init
from ddp_lab.launching import processes as _procs

CUDA_BUILD = pytest.mark.skipif(not torch.cuda._is_compiled(), reason="this torch is a CPU build: "
                                "it has no CUDA to initialise, so nothing can poison a fork")


@pytest.fixture
def fresh_watch(monkeypatch):
    """A watch of its own: no first call recorded, no door wrapped; put back afterwards."""
    monkeypatch.setattr(cuda_init, "_first", [])
    monkeypatch.setattr(cuda_init, "_originals", {})
    yield
    cuda_init.unwatch()


def test_the_watch_names_the_module_and_line_that_called_first(fresh_watch, tmp_path, monkeypatch):
    """Simulated on any build: a stand-in door (what torch._C._cuda_getDeviceCount is on a CUDA
    build), called at import by a module two imports deep."""
    calls = []
    door = types.SimpleNamespace(__name__="fake_cuda", _cuda_getDeviceCount=lambda: calls.append(1) or 0)
    monkeypatch.setitem(sys.modules, "fake_cuda", door)
    (tmp_path / "asks_at_import.py").write_text("import fake_cuda\n\nN = fake_cuda._cuda_getDeviceCount()\n")
    (tmp_path / "imports_it.py").write_text("import asks_at_import\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cuda_init.watch([("fake_cuda", "_cuda_getDeviceCount")])
    importlib.import_module("imports_it")
    first = cuda_init.first_init()
    assert calls == [1]  # the real function still ran
    assert (first.api, first.line, first.function, first.importing) == \
        ("fake_cuda._cuda_getDeviceCount()", 3, "<module>", "asks_at_import")
    assert first.file.endswith("asks_at_import.py")
    assert str(first).startswith("fake_cuda._cuda_getDeviceCount() at ") and \
        str(first).endswith("asks_at_import.py:3 (while importing asks_at_import)")
    door._cuda_getDeviceCount()  # later calls are not recorded again
    assert cuda_init.first_init() == first
    cuda_init.unwatch()
    assert not getattr(door._cuda_getDeviceCount, "_ddp_lab_watched", False)


def _in_subprocess(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, cwd=os.path.dirname(__file__),
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_counting_gpus_never_poisons_a_fork():
    # In a fresh process: in the suite's own, an earlier test may have initialised CUDA (on a CUDA
    # build, the full suite on 2.14.1 did), and this test would blame gpu_count for it.
    count, bad, said = _in_subprocess(f"""
        import {cuda_init.__name__} as cuda_init
        print(cuda_init.gpu_count()); print(cuda_init.forks_are_bad()); print(cuda_init.describe())
    """).splitlines()[:3]
    assert int(count) >= 0 and bad == "False"
    if not torch.cuda._is_compiled():
        assert count == "0" and said.startswith("this torch has no CUDA")


@CUDA_BUILD
def test_the_watch_names_a_real_import_that_initialised_cuda():
    """In a fresh process: torch.cuda.is_available() at import, in a module of its own."""
    out = _in_subprocess(f"""
        import torch
        import {cuda_init.__name__} as cuda_init
        print(cuda_init.gpu_count(), cuda_init.forks_are_bad())
        cuda_init.watch()
        import cuda_at_import
        print(cuda_init.forks_are_bad())
        print(cuda_init.describe())
    """).splitlines()
    assert out[0].endswith(" False") and out[1] == "True"
    assert out[2].startswith("CUDA was first initialised in this process by "
                             "torch.cuda.is_available() at ")
    assert "cuda_at_import.py:6 (while importing cuda_at_import)" in out[2]


def _bad_forks(world_size: int = 2) -> list[bool]:
    def body():
        import torch

        return torch.cuda._is_in_bad_fork()

    result = ddp_lab.launch(body, world_size=world_size, timeout=60, backend="gloo")
    assert result.ok, result.describe_failure()
    return result.values


def _lesson_modules() -> list[str]:
    import pkgutil

    import ddp_lab.lessons as lessons

    return [f"{lessons.__name__}.{m.name}" for m in pkgutil.iter_modules(lessons.__path__)
            if m.name.startswith("l")]


@CUDA_BUILD
def test_a_fork_server_with_every_lesson_preloaded_forks_ranks_that_can_use_cuda():
    """Every lesson module and DeepSpeed (lesson 12's preload) imported into the fork server:
    no import initialises CUDA there, and no launched rank is in a bad fork."""
    from ddp_lab.lessons import l12_sharded_modules as l12

    with warnings.catch_warnings():
        warnings.simplefilter("error", _procs.ForkServerPoisoned)
        assert ddp_lab.prewarm(wait=True, modules=_lesson_modules())
        assert l12.prewarm_deepspeed(wait=True)
    assert _procs.fork_server().poisoned is None
    assert _bad_forks() == [False, False]


@CUDA_BUILD
def test_a_module_that_initialises_cuda_is_named_and_the_server_replaced():
    """tests/cuda_at_import.py asks torch.cuda.is_available() at import: preloaded into the
    fork server, it would poison every later rank. The server says so, forks nothing more, and
    a new one without it takes over; the warning names the module and the line."""
    before = _procs.fork_server()
    with pytest.warns(_procs.ForkServerPoisoned) as caught:
        ddp_lab.prewarm(wait=True, modules=["cuda_at_import"])
    message = str(caught[0].message)
    assert "importing cuda_at_import initialised CUDA in the fork server" in message
    assert "torch.cuda.is_available() at " in message and "cuda_at_import.py:6" in message
    assert _procs.fork_server() is not before and "cuda_at_import" in _procs._excluded
    assert _bad_forks() == [False, False]
    ddp_lab.prewarm(wait=True, modules=["cuda_at_import"])  # asked again: not preloaded again
    assert _procs.fork_server().poisoned is None
