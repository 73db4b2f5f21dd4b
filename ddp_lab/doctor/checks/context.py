"""`Context`: what a check works with on each rank of a watched run (where the user's script, or
the function API's train_step, runs unchanged and the checks attach from outside), and how a
rank's records are written (JSON lines, as it goes) and read back (`read_records`). The keys a
rank records are listed in api.py (RANK_KEYS).

A step of the user's loop ends when an optimizer's `step()` returns (PyTorch's global
`register_optimizer_step_post_hook`): step k runs from the end of step k-1 (or the script's start)
to the end of step k, so a step that never returns (a hang, an exception) is the step it
happened in. Which optimizer's step ends a step: _context_steps.py. The models are found where the script wraps them: `DistributedDataParallel(...)`,
`fully_shard(...)`, `torch.compile(module)` (each wrapped at its class or module attribute before
the script imports it).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from ..frames import ScriptFiles
from ..userline import describe
from ._context_built import built_init, subclasses
from ._context_hooks import HandlerSwitch, UserHook
from ._context_records import RecordsFile, read_records  # noqa: F401 - the parent reads a rank's file here
from ._context_guard import guarded_each, mode_aside, mode_back
from ._context_steps import OptimizerHooks, StepOptimizer

KEEP = 500  # items kept per `add` key (the newest are dropped: the first are the evidence)
STEPS_KEPT = 100_000


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
        # where the user's code lives: the script's folder (the function API: its functions';
        # its code travels to the ranks by value, "<dynamic-code>", named again in the parent)
        self.files = ScriptFiles(script, folders, dynamic)
        self.script, self.folder = self.files.script, self.files.folder
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.step = 0
        self.records: dict[str, Any] = {}
        self.steps: list[dict] = [{"begin": time.time(), "end": None}]
        self._out = RecordsFile(records_path) if records_path else None
        self._step_end: list[Callable] = []
        self._model: list[Callable] = []
        self._finish: list[Callable] = []
        self._fsdp: list[Watched] = []
        self._roots: list[Watched] = []  # FSDP2's roots among _fsdp (models)
        self._others: list[Watched] = []
        self._functions: dict[Any, list[Callable]] = {}
        self._built: dict[type, list[Callable]] = {}  # on_built: class -> callbacks
        self._every: list[Callable] = []  # on_every_torch_function's handlers switched on now
        self.every_wanted = False  # some check asked for every torch function, at times
        self.every_changed: Callable | None = None  # the core's mode rereads _every (core.py)
        self._local = threading.local()
        self._stepping = StepOptimizer()  # which optimizer's step ends a step
        self._optimizer_hooks: OptimizerHooks | None = None
        self.steps_by_optimizer = True  # the function API ends a step when train_step returns
        self.group_started = False
        self.mode = None  # the TorchFunctionMode serving on_torch_function (watch/core.py)
        self.finished = False
        self._write({"step": 0, "begin": self.steps[0]["begin"]})

    # --- recording -------------------------------------------------------------------------
    def emit(self, key: str, value) -> None:
        self.records[key] = value
        self._write({"key": key, "value": value})

    def add(self, key: str, item, later: bool = False) -> None:
        """`item` appended under `key` (the first KEEP). `later`: its line may wait for the step's
        end (_context_records.py: a record a finished step needs, written once per step)."""
        items = self.records.setdefault(key, [])
        if len(items) < KEEP:
            items.append(item)
            self._write({"add": key, "item": item}, later)

    def _write(self, line: dict, later: bool = False) -> None:
        if self._out is not None:
            self._out.write(line, later)

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
        One TorchFunctionMode serves every check (core: core.FunctionWatch)."""
        for f in funcs:
            self._functions.setdefault(f, []).append(fn)

    def on_optimizer_step(self, before: Callable | None = None, after: Callable | None = None) -> None:
        """`before(optimizer)` / `after(optimizer)` around every optimizer's step, in the order
        the checks asked, under one guard (_context_steps.OptimizerHooks)."""
        self._optimizer_hooks = self._optimizer_hooks or OptimizerHooks(self)
        self._optimizer_hooks.add(before, after)

    def handler_switch(self, funcs, fn: Callable) -> HandlerSwitch:
        """`fn` as on_torch_function's handler of `funcs` while switched on (`.set(True)`;
        off at first): for a handler needed only between two events of a step."""
        return HandlerSwitch(self._functions, funcs, fn)

    def on_built(self, classes, fn: Callable) -> None:
        """`fn(ctx, obj, frame)` once an instance of one of `classes` (or of a subclass) is built,
        `frame` the caller of its constructor: what the script builds beside its models (an
        optimizer, an LR scheduler, a GradScaler). Each class's `__init__` and its subclasses'
        own are wrapped once; a subclass's `super().__init__` is the same build, reported once,
        when the outermost returns. Never for the checks' own builds."""
        for cls in classes:
            self._built.setdefault(cls, []).append(fn)
            for c in [cls, *subclasses(cls)]:
                if "__init__" in vars(c) and not getattr(c.__init__, "_watched", False):
                    c.__init__ = built_init(self, c.__init__)

    def off_torch_function(self, funcs, fn: Callable) -> None:
        """`fn` no longer called after `funcs` (a check that watches for a while: it leaves the
        core's table, so the calls it no longer needs cost nothing)."""
        for f in funcs:
            handlers = self._functions.get(f)
            if handlers is not None and fn in handlers:
                handlers.remove(fn)

    def on_every_torch_function(self, fn: Callable) -> Callable[[bool], None]:
        """`fn(func, args, kwargs, result)` after EVERY torch function called from eager code,
        while switched on; returns `switch(on)` (it starts off). For a check that follows a few
        tensors for a while (collectives: the results a collective left undefined): switched
        off, the mode's common path is unchanged (one dict lookup); on, every torch call pays
        for the handler, so a check switches it on only while it has something to follow."""
        self.every_wanted = True

        def switch(on: bool) -> None:
            if bool(on) == (fn in self._every):
                return
            (self._every.append if on else self._every.remove)(fn)
            if self.every_changed is not None:
                self.every_changed()
        return switch

    def guard(self, fn: Callable) -> Callable:
        """`fn` wrapped so that an exception of the check's own code is recorded (under
        "check-errors"), never raised into the user's script."""
        local = self._local

        def guarded(*args, **kwargs):  # in_checks() inline: no context manager per hook call
            if getattr(local, "checking", False):
                return None
            local.checking = True  # it was False: what it goes back to
            aside = mode_aside(self)
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a check must not break the script
                self.add("check-errors", f"{getattr(fn, '__qualname__', fn)}: {type(exc).__name__}: {exc}")
                return None
            finally:
                if aside:
                    mode_back(self)
                local.checking = False
        return guarded

    def user_hook(self, fn: Callable, guarded: bool = True) -> UserHook:
        """The hook a check registers on the user's object (`module.register_forward_hook(
        ctx.user_hook(fn))`, an optimizer's, a tensor's): `fn` under `guard` (`guarded=False`:
        a hook that guards its own inner call, kept cheap or traceable by dynamo); the script's
        own pickle, torch.save or deepcopy of that object carries an inert no-op instead of the
        check and its context (_context_hooks.py)."""
        return UserHook(self.guard(fn) if guarded else fn)

    def guarded_each(self, fns, *args) -> None:
        """`guard(fn)(*args)` for each of `fns` (a None skipped), with no wrapper per call."""
        guarded_each(self, fns, args)

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
        return self.files.holds(filename)

    def user_frame(self, frame=None):
        """(file, line number, the line's text) of the innermost frame in the user's files."""
        return self.files.frame(frame or sys._getframe(1))

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
            if not self._stepping.counts(optimizer):
                return  # a second optimizer (a GAN's) steps inside the same step
        now = time.time()
        if self._out is not None:
            self._out.holding = True  # this step's end, its hooks' records, the next begin: one write
        self.steps[-1]["end"] = now
        try:
            if self._out is not None:  # as _write({"step": ..., "end": now}), cheaper
                self._out.step(self.step, "end", now)
            self.guarded_each(self._step_end, self)  # a SystemExit (the reference's) ends here
            self.step += 1
            if len(self.steps) < STEPS_KEPT:
                self.steps.append({"begin": time.time(), "end": None})
                if self._out is not None:
                    self._out.step(self.step, "begin", self.steps[-1]["begin"])
        finally:
            if self._out is not None:
                self._out.release()

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
