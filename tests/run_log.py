"""What the suite launches, in every process of the session that launches ranks: this one, the
notebooks' kernels (strict nbval's, the portable pass's, the exercises' kernel) and none other.

Each `ddp_lab.launch` appends one line to the session's launch log (JSON: when, which process,
the run's label, its ranks and seconds): tests/suite_budget.py counts them per folder and per
notebook. In a kernel of the session's own strict nbval pass, a scenario run exactly as the
registry declares it (`scenario.run("broken")`: no argument changed) is also kept, with the
processes it left behind and the variables the notebook had changed, for
tests/course/test_registry.py and the lesson tests (`conftest.scenario_run`): where their own
environment has those values (the ranks would get the same), they check that run instead of
launching the same one again. So is watch's report on a corpus script (notebook 11), under the
call that made it (file, args, nproc, timeout), for the corpus tests.

A kernel loads this file at start-up from the session's IPython folder (IPYTHONDIR, set by
`session_start`; kernels inherit it): the modules are wrapped when they are first imported, so a
notebook's namespace and outputs are as without it.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import inspect
import json
import os
import shutil
import sys
import tempfile
import time

LOG_VAR = "DDP_LAB_SUITE_LOG"      # the launch log (a file)
RUNS_VAR = "DDP_LAB_SUITE_RUNS"    # the folder of the notebooks' scenario runs
ORIGIN_VAR = "DDP_LAB_SUITE_ORIGIN"  # set for their kernels by the portable pass ("portable")
# and by the lane ("lane": its kernels keep runs as this session's own kernels do)
HOOK = os.path.abspath(__file__)
CORPUS = os.path.join(os.path.dirname(HOOK), "corpus") + os.sep

current_test = ""  # this process's running test (the plugin sets it): the launch's owner
_corpus = ""  # the corpus file the launch being made runs (watch's script, the doctor's model)
_argv: list = []  # and the script's arguments (watch: a control script runs under several)


# --- In any process: wrap the launcher (and, in a kernel, the registry) when imported ----------

def _log_launch(result, origin: str) -> None:
    path = os.environ.get(LOG_VAR)
    if not path:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "origin": origin,
                       "test": current_test, "label": getattr(result, "label", ""),
                       "corpus": _corpus, "argv": _argv,
                       "ranks": len(getattr(result, "ranks", [])),
                       "seconds": round(getattr(result, "seconds", 0.0), 3)})
    with open(path, "a") as f:  # one short line, appended: whole even with several writers
        f.write(line + "\n")


def _wrap_launcher(module, origin: str) -> None:
    """Every launch pickles what it sends (`_pickle_payload`) and ends in `_collect`, whatever
    name the caller imported `launch` under."""
    collect, payload = module._collect, module._pickle_payload
    if getattr(collect, "_logged", False):
        return

    def noted_payload(fn, args, kwargs):
        global _corpus, _argv
        _corpus = corpus_file(args, kwargs)
        _argv = next((list(v) for v in args if isinstance(v, (list, tuple))
                      and all(isinstance(x, str) for x in v)), []) if _corpus else []
        return payload(fn, args, kwargs)

    def logged_collect(*args, **kwargs):
        global _corpus, _argv
        result = collect(*args, **kwargs)
        _log_launch(result, origin)
        _corpus, _argv = "", []
        return result

    logged_collect._logged = True
    module._collect, module._pickle_payload = logged_collect, noted_payload


def corpus_file(args, kwargs) -> str:
    """The file of tests/corpus/ a launch runs, relative to it ("watch/20_.../broken.py"): a
    script path among its arguments (watch), or the file defining the model it builds (the
    doctor's ModelSource: a class or a factory); "" for any other launch."""
    for value in [*args, *kwargs.values()]:
        obj = getattr(value, "obj", value)
        files = [os.path.abspath(value)] if isinstance(value, str) else []
        code = getattr(obj, "__code__", None)
        files += [code.co_filename] if code else []
        if isinstance(obj, type):
            files += [f.__code__.co_filename for f in vars(obj).values() if hasattr(f, "__code__")]
        hit = next((f for f in files if f.startswith(CORPUS) and f.endswith(".py")), None)
        if hit:
            return hit[len(CORPUS):]
    return ""


def _wrap_registry(module, runs: str, start_env: dict, start_path: list) -> None:
    """Keep `Scenario.run(which)` made with no other argument and sys.path as it was when the
    process started (the ranks get both), with the variables the notebook set or changed since
    (`env`: lesson 12 names DeepSpeed's accelerator): the test that reads the run takes it only
    where its own environment has the same values, the launch it would make."""
    Scenario = module.Scenario
    run = Scenario.run
    if getattr(run, "_kept", False):
        return

    def kept_run(self, which: str = "broken", **kwargs):
        from ddp_lab.launching.processes import descendants

        before = descendants(os.getpid())
        result = run(self, which, **kwargs)
        if not kwargs and _path() == start_path:
            env = {k: os.environ.get(k) for k in set(start_env) | set(os.environ)
                   if os.environ.get(k) != start_env.get(k)}
            _store(runs, f"{self.key.replace('/', '__')}__{which}",
                   {"result": result, "leftovers": _leftovers(before), "env": env})
        return result

    kept_run._kept = True
    Scenario.run = kept_run


def _path() -> list[str]:
    """sys.path, less the start-up folder IPython puts first while it runs this file."""
    startup = os.path.join("profile_default", "startup")
    return [p for p in sys.path if not p.endswith(startup)]


def _store(runs: str, name: str, record: dict) -> None:
    """Keep `record` as `name` unless a run is kept there already (a notebook may run a variant
    twice: the first run is kept); one that cannot be pickled is not kept (its test runs it)."""
    import cloudpickle

    path = os.path.join(runs, name + ".pkl")
    if os.path.exists(path):
        return
    try:
        data = cloudpickle.dumps(dict(record, t=time.time(), pid=os.getpid()))
    except Exception:
        return
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _leftovers(before: set, wait: float = 3.0) -> list[str]:
    """What conftest.no_leftovers checks: processes started by the run (the fork server aside)
    still alive `wait` s after it."""
    from ddp_lab.launching import processes

    server = processes._server.proc.pid if processes._server is not None else None
    deadline = time.time() + wait
    while True:
        extra = processes.descendants(os.getpid()) - before - {server}
        if not extra or time.time() > deadline:
            return [f"{pid} ({_cmdline(pid)})" for pid in sorted(extra)]
        time.sleep(0.05)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().replace("\0", " ").strip()[:160] or "?"
    except OSError:
        return "gone"


def _wrap_watch(module, runs: str) -> None:
    """Keep watch's report on a corpus script run with every check, the default first-step
    allowance and no declared global batch (the call tools/corpus_score.py's watch_run makes),
    keyed by the call (file, args, nproc, timeout, reference), for the corpus tests to read. The names bound to watch_script in the
    package's modules already imported (`from .script import watch_script`: ddp_lab.watch(),
    the CLI) are rebound too; a module imported later takes the wrapped one."""
    watch_script = module.watch_script
    if getattr(watch_script, "_kept", False):
        return
    signature = inspect.signature(watch_script)

    def kept_watch(*args, **kwargs):
        report = watch_script(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        given = dict(call.arguments)
        corpus = corpus_file([given["path"]], {})
        if corpus and given["checks"] is None and given["first_step_timeout"] is None \
                and given.get("global_batch") is None:
            _store(runs, watch_key(corpus, given["args"], given["nproc"], given["timeout"],
                                   given.get("reference")), {"report": report})
        return report

    kept_watch._kept = True
    for name, loaded in list(sys.modules.items()):
        if name.startswith(PACKAGE) and getattr(loaded, "watch_script", None) is watch_script:
            loaded.watch_script = kept_watch


def watch_key(corpus: str, args, nproc: int, timeout: float, reference=None) -> str:
    """The name a corpus script's watch report is kept under: its file and the call's arguments."""
    call = json.dumps([list(args), nproc, float(timeout), reference])
    return "corpus__" + corpus.replace(os.sep, "__") + "__" + hashlib.sha1(call.encode()).hexdigest()[:12]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the package `name` as the other finders do, and calls `then()` once it has run (its
    loader otherwise unchanged: source, file name and resources as before)."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenLoader(spec.loader, self.then)
                return spec
        return None


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, then):
        self._loader, self._then = loader, then

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name):  # get_source, get_filename, get_resource_reader, ...
        return getattr(self._loader, name)


PACKAGE = "ddp_lab"  # imported first whichever module of it is: the rest are imported by statement


def install(origin: str, runs: str | None = None) -> None:
    """Wrap the launcher (and with `runs`, the registry's scenario runs and watch's script mode)
    once the package is imported: now if it is."""
    start = dict(os.environ), _path()

    def wrap():
        from ddp_lab.launching import launcher

        _wrap_launcher(launcher, origin)
        if runs:
            from ddp_lab.course import registry
            from ddp_lab.doctor.watch import script

            _wrap_registry(registry, runs, *start)
            _wrap_watch(script, runs)

    if PACKAGE in sys.modules:
        wrap()
    else:
        sys.meta_path.insert(0, _AfterImport(PACKAGE, wrap))


# --- In this process: the session's log, folder and kernels' start-up file ----------------------

class Session:
    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="ddp-lab-suite-")
        # removed when the process ends, after the exit handlers registered later run (LIFO):
        # an IPython shell made by a test keeps its history here until then
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
        self.log = os.path.join(self.folder, "launches.jsonl")
        self.runs = os.path.join(self.folder, "runs")
        os.mkdir(self.runs)
        ipython = os.path.join(self.folder, "ipython")
        startup = os.path.join(ipython, "profile_default", "startup")
        os.makedirs(startup)
        with open(os.path.join(ipython, "profile_default", "ipython_config.py"), "w") as f:
            f.write("c.HistoryManager.hist_file = ':memory:'\n")  # kernels side by side
        with open(os.path.join(startup, "50-ddp-lab-suite.py"), "w") as f:
            f.write(f"__import__('runpy').run_path({HOOK!r}, run_name='ddp_lab_suite_hook')\n")
        self.saved = {k: os.environ.get(k) for k in (LOG_VAR, RUNS_VAR, "IPYTHONDIR")}
        os.environ.update({LOG_VAR: self.log, RUNS_VAR: self.runs, "IPYTHONDIR": ipython})
        install("pytest")

    def launches(self) -> list[dict]:
        try:
            with open(self.log) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def _kept(self, name: str) -> dict | None:
        import cloudpickle

        path = os.path.join(self.runs, name + ".pkl")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return cloudpickle.loads(f.read())

    def notebook_run(self, key: str, which: str) -> dict | None:
        """The notebook's run of `key` `which`, kept by its kernel: {"result", "leftovers", "t"}."""
        return self._kept(f"{key.replace('/', '__')}__{which}")

    def notebook_watch_report(self, script: str, args, nproc: int, timeout: float, reference=None):
        """watch's report on a corpus script that a notebook ran with these arguments."""
        corpus = corpus_file([script], {})
        kept = self._kept(watch_key(corpus, args, nproc, timeout, reference)) if corpus else None
        return kept["report"] if kept else None

    def close(self) -> None:
        """The variables as they were (the folder goes when the process ends: __init__)."""
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "ddp_lab_suite_hook":  # a kernel's start-up
    origin = os.environ.get(ORIGIN_VAR, "kernel")
    install(origin, os.environ.get(RUNS_VAR) if origin in ("kernel", "lane") else None)
