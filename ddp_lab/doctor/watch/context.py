"""What a check of watch's script mode works with: `Context` on each rank (where the user's
script runs unchanged and the checks attach from outside), `Evidence` in the parent (what the
ranks recorded, and the launch itself).

A step of the user's loop ends when an optimizer's `step()` returns (PyTorch's global
`register_optimizer_step_post_hook`): step k runs from the end of step k-1 (or the script's start)
to the end of step k, so a step that never returns (a hang, an exception) is the step it
happened in. The models are found where the script wraps them: `DistributedDataParallel(...)`,
`fully_shard(...)`, `torch.compile(module)` (each wrapped at its class or module attribute before
the script imports it).
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

KEEP = 500  # items kept per `add` key (the newest are dropped: the first are the evidence)
STEPS_KEPT = 100_000
_HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ddp_lab/


@dataclass
class Watched:
    """A model the script wrapped: kind "ddp", "fsdp2" or "compiled"; `module` the plain one."""

    kind: str
    wrapper: Any
    module: Any
    line: str = ""


class Context:
    """One rank's view of the running script, for the checks' hooks (see checks/__init__.py)."""

    def __init__(self, script: str, records_path: str | None = None, folders=(),
                 dynamic: bool = False):
        self.script = os.path.abspath(script)
        self.folder = os.path.dirname(self.script)
        # where the user's code lives: the script's folder (the function API: its functions')
        self.folders = tuple(dict.fromkeys([self.folder, *map(os.path.abspath, folders)]))
        # The function API's code travels to the ranks by value (cloudpickle names its file
        # "<dynamic-code>"): it is the user's, named again in the parent (restore_where).
        self.dynamic = dynamic
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.step = 0
        self.records: dict[str, Any] = {}
        self.steps: list[dict] = [{"begin": time.time(), "end": None}]
        self._out = open(records_path, "a", encoding="utf-8") if records_path else None
        self._step_end: list[Callable] = []
        self._model: list[Callable] = []
        self._finish: list[Callable] = []
        self._fsdp: list[Watched] = []
        self._roots: list[Watched] = []  # FSDP2's roots among _fsdp (models)
        self._others: list[Watched] = []
        self._functions: dict[Any, list[Callable]] = {}
        self._local = threading.local()
        self._stepping_optimizer = None
        self.steps_by_optimizer = True  # the function API ends a step when train_step returns
        self.group_started = False
        self.mode = None  # the TorchFunctionMode serving on_torch_function (script_mode)
        self.finished = False
        self._write({"step": 0, "begin": self.steps[0]["begin"]})

    # --- recording -------------------------------------------------------------------------
    def emit(self, key: str, value) -> None:
        self.records[key] = value
        self._write({"key": key, "value": value})

    def add(self, key: str, item) -> None:
        items = self.records.setdefault(key, [])
        if len(items) < KEEP:
            items.append(item)
            self._write({"add": key, "item": item})

    def _write(self, line: dict) -> None:
        if self._out is not None:
            try:
                self._out.write(json.dumps(line, default=str) + "\n")
                self._out.flush()  # a rank that hangs or dies later still told us this
            except (OSError, ValueError, TypeError):
                pass

    # --- callbacks -------------------------------------------------------------------------
    def on_step_end(self, fn: Callable) -> None:
        self._step_end.append(fn)

    def on_model(self, fn: Callable) -> None:
        self._model.append(fn)

    def on_finish(self, fn: Callable) -> None:
        self._finish.append(fn)

    def on_torch_function(self, funcs, fn: Callable) -> None:
        """`fn(func, args, kwargs, result)` after any of `funcs` (torch functions or Tensor
        methods, e.g. torch.Tensor.item, torch.nn.functional.cross_entropy) returns, called
        from eager code (never while torch.compile traces; never for the checks' own calls).
        One TorchFunctionMode serves every check (core: script_mode.FunctionWatch)."""
        for f in funcs:
            self._functions.setdefault(f, []).append(fn)

    def guard(self, fn: Callable) -> Callable:
        """`fn` wrapped so that an exception of the check's own code is recorded (under
        "check-errors"), never raised into the user's script."""
        def guarded(*args, **kwargs):
            if getattr(self._local, "checking", False):
                return None
            try:
                with self.in_checks():
                    return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a check must not break the script
                self.add("check-errors", f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")
                return None
        return guarded

    @contextmanager
    def in_checks(self):
        """The checks' own torch calls inside: other checks' hooks do not see them."""
        before = getattr(self._local, "checking", False)
        self._local.checking = True
        try:
            yield
        finally:
            self._local.checking = before

    @property
    def checking(self) -> bool:
        return getattr(self._local, "checking", False)

    # --- the models ------------------------------------------------------------------------
    @property
    def models(self) -> list[Watched]:
        """DDP and compiled wrappers in the order made, then FSDP2's roots (a fully_shard'ed
        module inside another one is not a root). Checks read it every step: the roots are
        worked out when a model is wrapped, the only time they change."""
        return self._others + self._roots

    def _fsdp_roots(self) -> list[Watched]:
        return [w for w in self._fsdp
                if not any(o is not w and any(m is w.module for m in o.module.modules())
                           for o in self._fsdp)]

    def model_wrapped(self, kind: str, wrapper, module, frame=None) -> None:
        w = Watched(kind, wrapper, module, self.user_line(frame))
        (self._fsdp if kind == "fsdp2" else self._others).append(w)
        if kind == "fsdp2":
            self._roots = self._fsdp_roots()
        self.add("models", {"kind": kind, "type": class_name(module), "line": w.line})
        for fn in self._model:
            self.guard(fn)(self, w)

    # --- where in the user's code ----------------------------------------------------------
    def is_user_file(self, filename: str) -> bool:
        if filename.startswith("<dynamic-code"):
            return self.dynamic
        name = os.path.abspath(filename)
        if name != self.script and not any(name.startswith(f + os.sep) for f in self.folders):
            return False
        return not any(s in name for s in (os.sep + "site-packages" + os.sep, _HOME + os.sep))

    def user_frame(self, frame=None):
        """(file, line number, the line's text) of the innermost frame in the user's files."""
        frame = frame or sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if self.is_user_file(name):
                if name.startswith("<dynamic-code"):  # named in the parent: restore_where
                    code = frame.f_code
                    return f"<dynamic-code:{getattr(code, 'co_qualname', code.co_name)}>", frame.f_lineno, ""
                return name, frame.f_lineno, linecache.getline(name, frame.f_lineno).strip()
            frame = frame.f_back
        return None

    def user_line(self, frame=None) -> str:
        """"train.py:42: loss.backward()", or "" when no frame of the stack is the user's."""
        found = self.user_frame(frame or sys._getframe(1))
        return describe(*found) if found else ""

    # --- steps (called by the core) --------------------------------------------------------
    def step_ended(self, optimizer) -> None:
        """An optimizer's step returned (None: the function API's train_step returned)."""
        if optimizer is not None:
            if not self.steps_by_optimizer:
                return
            if self._stepping_optimizer is None:
                self._stepping_optimizer = optimizer
            if optimizer is not self._stepping_optimizer:
                return  # a second optimizer (a GAN's) steps inside the same step
        now = time.time()
        self.steps[-1]["end"] = now
        self._write({"step": self.step, "end": now})
        for fn in self._step_end:
            self.guard(fn)(self)
        self.step += 1
        if len(self.steps) < STEPS_KEPT:
            self.steps.append({"begin": time.time(), "end": None})
            self._write({"step": self.step, "begin": self.steps[-1]["begin"]})

    def finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        for fn in self._finish:
            self.guard(fn)(self)
        if self._out is not None:
            self._out.close()
            self._out = None

    def snapshot(self) -> dict:
        """Everything this rank recorded, as plain data (the torchrun path sends it whole)."""
        return dict(self.records, steps=self.steps)


def class_name(module) -> str:
    """The user's class name: fully_shard swaps a module's class for FSDP<Name> (a subclass of
    FSDPModule and the original, torch/distributed/fsdp/_fully_shard/_fully_shard.py)."""
    cls = type(module)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) > 1:
        cls = cls.__bases__[-1]
    return cls.__name__


def describe(filename: str, lineno: int, text: str | None = None) -> str:
    """"train.py:42: loss.backward()" (the line's text read from the file unless given)."""
    if filename.startswith("<dynamic-code"):
        return f"{filename}:{lineno}: {text or ''}"
    from ..frames import short_file  # a notebook cell's file is named "<notebook cell>"

    if text is None:
        text = linecache.getline(filename, lineno).strip()
    return f"{short_file(filename)}:{lineno}: {text}"


_DYNAMIC = __import__("re").compile(r"<dynamic-code:([^>]+)>:(\d+): ?")


def code_files(*objects) -> dict[str, str]:
    """{qualified name: file} of the user's functions and classes' methods: `objects` and every
    function or class in their modules' globals (a notebook's cells, a loaded file)."""
    import inspect

    out: dict[str, str] = {}
    seen = set()

    def add(obj):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        code = getattr(obj, "__code__", None)
        if code is not None and not code.co_filename.startswith("<"):
            out.setdefault(getattr(code, "co_qualname", code.co_name), code.co_filename)
        if inspect.isclass(obj):
            for value in vars(obj).values():
                add(getattr(value, "__func__", value))
    for obj in objects:
        if obj is None:
            continue
        add(obj)
        for value in list(getattr(obj, "__globals__", {}).values()):
            if inspect.isfunction(value) or inspect.isclass(value):
                add(value)
    return out


def restore_where(text: str, files: dict[str, str]) -> str:
    """"<dynamic-code:train_step>:75: " -> "cell.py:75: loss = ..." where `files` knows it."""
    def named(m):
        path = files.get(m.group(1))
        if path is None:
            return f"{m.group(1)}, line {m.group(2)}: "
        return describe(path, int(m.group(2)))
    return _DYNAMIC.sub(named, text)


def read_records(path: str) -> dict:
    """A rank's records file (JSON lines, written as it went) as {key: value}, with "steps"."""
    out: dict[str, Any] = {}
    steps: dict[int, dict] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {"steps": []}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short when the rank was killed
        if "key" in item:
            out[item["key"]] = item["value"]
        elif "add" in item:
            out.setdefault(item["add"], []).append(item["item"])
        elif "step" in item:
            s = steps.setdefault(item["step"], {"begin": None, "end": None})
            s.update({k: v for k, v in item.items() if k in ("begin", "end")})
    out["steps"] = [steps[k] for k in sorted(steps)]
    return out


class Evidence:
    """What a check's `judge` reads: `ranks` (per rank, {key: value} as emitted, with "steps"),
    `run` (the launch's RunResult; None under torchrun), the script and the world size."""

    def __init__(self, ranks: list[dict], run=None, script: str = "", world_size: int = 0,
                 args: tuple = ()):
        self.ranks = ranks
        self.run = run
        self.script = script
        self.args = tuple(args)
        self.world_size = world_size or len(ranks)

    def steps(self, rank: int) -> list[dict]:
        return self.ranks[rank].get("steps", []) if rank < len(self.ranks) else []

    def step_at(self, rank: int, when: float) -> int | None:
        """The step rank `rank` was in at wall-clock time `when`."""
        found = None
        for i, s in enumerate(self.steps(rank)):
            if s.get("begin") is not None and s["begin"] <= when:
                found = i
        return found

    @staticmethod
    def same(values, rel: float = 1e-5) -> bool:
        values = list(values)
        if not values:
            return True
        ref = values[0]
        return all(abs(v - ref) <= rel * max(1.0, abs(ref)) for v in values)
