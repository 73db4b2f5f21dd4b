"""`CompileWatch`: what `torch.compile` did on this rank, step by step -- the graphs it compiled
and their ops, each graph break with the line of user code that caused it, each recompile with
the guard that failed, the seconds spent compiling, and how many compiled backward graphs have
run so far. It runs inside a rank and returns plain data (lesson 15 and the doctor read it).

Everything comes from what torch reports itself: the graphs a dynamo backend receives (under
DDP, DDPOptimizer hands the backend one graph per bucket-sized piece), dynamo's `graph_breaks` and
`recompiles` logs (what `TORCH_LOGS=graph_breaks,recompiles` prints; they also go to the
rank's stderr), and `torch._dynamo.utils.compilation_time_metrics`.

The graphs run on `aot_eager` (AOTAutograd with no-op compilers) unless another compiler is
named: the same capture, guards, recompiles and DDPOptimizer splits as inductor, executed by
eager kernels -- so it shows what compiling costs, not what inductor's kernels would gain.
`BackwardHookSites` records where module-level backward hooks are registered: dynamo names the
module's call when it cannot trace one, never the line that registered it.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from ..launching import frames, launcher

GRAPH_BREAKS = "torch._dynamo.symbolic_convert.__graph_breaks"
RECOMPILES = "torch._dynamo.guards.__recompiles"
_LIBRARY = ("/torch/", "/contextlib.py", "/functools.py", "<frozen") + tuple(
    "/" + place for place in (*frames.ENGINE, frames.place(launcher), frames.place(__file__)))


@dataclass
class Break:
    """One graph break: PyTorch's reason (first lines), and the innermost frame of user code."""

    reason: str
    where: str = ""  # "path:line in function" of the user's frame ("" if none is the user's)
    code: str = ""  # that line's source


@dataclass
class Recompile:
    """One recompile: the function, and the guard that failed first (PyTorch's words)."""

    function: str
    guard: str
    where: str = ""  # "path:line in function" of the user's code the guard names, if any


@dataclass
class Step:
    """What one step added: graphs compiled (ops each), recompiles, breaks, compile seconds."""

    graphs: list[int] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    breaks: list[Break] = field(default_factory=list)
    compile_s: float = 0.0


def user_frame(text: str, own: tuple[str, ...] = ()) -> tuple[str, str]:
    """("path:line in function", source line) of the innermost frame in `text` (a traceback or
    a stack trace) that is not torch's, Python's or ddp_lab's plumbing (nor in `own`), counting
    only the frames inside the compiled call (after torch._dynamo's own last frame): a graph
    break inside DDP's forward is DDP's, not the training loop's that called it."""
    import linecache

    found = list(frames.FRAME.finditer(text))
    entered = [i for i, m in enumerate(found) if "/torch/_dynamo/" in m.group(1).replace("\\", "/")]
    found = found[entered[-1] + 1:] if entered else found  # inside the compiled call only
    found = [m for m in found
             if not any(s in m.group(1).replace("\\", "/") for s in _LIBRARY + own)]
    if not found:
        return "", ""
    path, line, fn = found[-1].groups()
    return f"{path}:{line} in {fn}", linecache.getline(path, int(line)).strip()


def _whole(cut: str, line: str, fn: str, message: str) -> str:
    """The whole path of a file the guard's comment names by the end of its path only (torch
    cuts it to a width: "mp/work/train.py"), from the user stack trace the same message
    carries ("File "/tmp/work/train.py", line 8, in forward"); `cut` when none matches."""
    for path, n, f in frames.FRAME.findall(message):
        if n == line and f == fn and path.endswith(cut):
            return path
    return cut


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class CompileWatch:
    """Use `watch.backend` as `torch.compile(..., backend=watch.backend)` inside `with watch:`;
    call `watch.step()` after each training step for what that step added. Entering turns on
    torch's `graph_breaks` and `recompiles` logs (`torch._logging.set_logs`); leaving sets torch's
    logging back to its defaults."""

    def __init__(self, own: tuple[str, ...] = (), compiler: str = "aot_eager",
                 mode: str | None = None, dynamic: bool | None = None):
        self.own = own  # more file fragments that are not the user's code (the doctor's)
        # what compiles each graph after it is recorded: "aot_eager" (backward runs counted),
        # "inductor" (with torch.compile's `mode`), or any backend name dynamo knows
        self.compiler, self.mode, self.dynamic = compiler, mode, dynamic
        self.graphs: list[list[str]] = []  # each compiled graph's ops, in order
        self.lines: list[list[str]] = []  # each compiled graph's ops' user lines
        self.reasons: list[str] = []  # why each graph ends where it does, when torch says why
        self.backward_runs = 0
        self.steps: list[Step] = []
        self._breaks, self._recompiles = _Records(), _Records()
        self._seen = (0, 0, 0, 0.0)

    # --- the backend --------------------------------------------------------------------
    def backend(self, gm, example_inputs, **kwargs):
        from torch._dynamo.backends.debugging import aot_eager

        nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        self.graphs.append([getattr(n.target, "__name__", str(n.target)) for n in nodes])
        self.lines.append([user_frame(n.meta.get("stack_trace") or "", self.own)[0] for n in nodes])
        why = getattr(gm, "compile_subgraph_reason", None)  # DDPOptimizer sets it on its splits
        self.reasons.append(str(why.reason) if why is not None and why.graph_break else "")
        if self.compiler == "aot_eager":
            return aot_eager(gm, example_inputs, bw_compiler=self._counted_backward, **kwargs)
        return self._compiler()(gm, example_inputs)

    def _compiler(self):
        """The backend torch.compile itself would use for `self.compiler`: for inductor, the
        wrapper that applies `mode` (torch/__init__.py:2414, _TorchCompileInductorWrapper)."""
        import torch

        if self.compiler == "inductor":
            return torch._TorchCompileInductorWrapper(self.mode, None, self.dynamic)
        return torch._dynamo.lookup_backend(self.compiler)

    def _counted_backward(self, gm, example_inputs):
        from torch._dynamo.backends.debugging import boxed_nop

        run = boxed_nop(gm, example_inputs)

        def counted(args):
            out = run(args)
            self.backward_runs += 1
            return out

        counted._boxed_call = True
        return counted

    # --- the logs -----------------------------------------------------------------------
    def __enter__(self) -> "CompileWatch":
        import torch

        torch._logging.set_logs(graph_breaks=True, recompiles=True)
        logging.getLogger(GRAPH_BREAKS).addHandler(self._breaks)
        logging.getLogger(RECOMPILES).addHandler(self._recompiles)
        self._seen = (0, 0, 0, _compile_seconds())
        return self

    def __exit__(self, *exc) -> None:
        import torch

        logging.getLogger(GRAPH_BREAKS).removeHandler(self._breaks)
        logging.getLogger(RECOMPILES).removeHandler(self._recompiles)
        torch._logging.set_logs()

    def step(self) -> Step:
        """What happened since the last call (or since `with`), recorded in `self.steps`."""
        graphs, breaks, recompiles, seconds = self._seen
        now = (len(self.graphs), len(self._breaks.messages), len(self._recompiles.messages),
               _compile_seconds())
        step = Step([len(g) for g in self.graphs[graphs:]],
                    [self._recompile(m) for m in self._recompiles.messages[recompiles:]],
                    [self._break(m) for m in self._breaks.messages[breaks:]],
                    now[3] - seconds)
        self._seen = now
        self.steps.append(step)
        return step

    def _break(self, message: str) -> Break:
        lines = message.splitlines()
        at = message.find("Graph Break Reason:")
        reason = message[at + len("Graph Break Reason:"):].strip() if at >= 0 else lines[0]
        why = [ln for ln in reason.splitlines() if ln.strip()]
        # "Failed to handle graph break gracefully..." / "Encountered graph break when ...":
        # the reason proper is the next line
        head = why[1] if len(why) > 1 and why[0].endswith(":") else why[0] if why else ""
        where, code = user_frame(message, self.own)
        return Break(head.strip(), where, code)

    def _recompile(self, message: str) -> Recompile:
        fn = re.search(r"Recompiling function (\S+)", message)
        guard = next((ln.strip()[2:] for ln in message.splitlines() if ln.strip().startswith("- ")
                      and re.match(r"- \d+/\d+:", ln.strip())), "")
        named = re.search(r"#\s*(?:#\s*)?(\S+?):(\d+) in (\S+)", guard)
        where = ""
        if named:
            cut, line, function = named.groups()
            path = _whole(cut, line, function, message)
            if not any(s in path for s in _LIBRARY + self.own):
                where = f"{path}:{line} in {function}"
        guard = re.sub(r"^\d+/\d+: ", "", guard.split("#")[0].strip())  # "4/0: " varies by run
        return Recompile(fn.group(1) if fn else "?", guard, where)

    # --- summaries ----------------------------------------------------------------------
    @property
    def break_messages(self) -> list[str]:
        """Every graph break as dynamo logged it (reason, user code traceback)."""
        return list(self._breaks.messages)

    def user_breaks(self) -> list[Break]:
        """The graph breaks whose cause lies in user code, each once."""
        seen, out = set(), []
        for b in (b for s in self.steps for b in s.breaks if b.where):
            if (b.where, b.reason) not in seen:
                seen.add((b.where, b.reason))
                out.append(b)
        return out

    def summary(self) -> dict:
        """Plain data for the parent: per step, graphs compiled, recompiles, compile seconds."""
        return {"graphs": len(self.graphs), "ops": sum(len(g) for g in self.graphs),
                "graphs_per_step": [len(s.graphs) for s in self.steps],
                "recompiles_per_step": [len(s.recompiles) for s in self.steps],
                "compile_s": [s.compile_s for s in self.steps],
                "recompiles": [vars(r) for s in self.steps for r in s.recompiles],
                "user_breaks": [vars(b) for b in self.user_breaks()],
                "user_break_count": len(self.user_breaks()),
                "backward_runs": self.backward_runs}


# the registrations of module-level backward hooks: nn.Module's methods
# (torch/nn/modules/module.py:1385, 1434, 1460) and the global ones of that module (:296, 325, 352)
MODULE_HOOKS = ("register_full_backward_hook", "register_backward_hook",
                "register_full_backward_pre_hook")
GLOBAL_HOOKS = ("register_module_full_backward_hook", "register_module_backward_hook",
                "register_module_full_backward_pre_hook")


class BackwardHookSites:
    """`with BackwardHookSites() as sites:` records every module-level backward hook registered
    inside, with the user's line that registered it (`sites.sites`: {"call", "module", "where"}).
    Dynamo cannot trace a module that has one without compiled autograd
    (torch/_dynamo/variables/distributed.py:174, "Module-level backwards hooks require compiled
    autograd."), and its error names the module's call in forward, not the registration."""

    def __init__(self, own: tuple[str, ...] = ()):
        self.own = own
        self.sites: list[dict] = []
        self._saved: list[tuple] = []

    def __enter__(self) -> "BackwardHookSites":
        import torch.nn.modules.module as mm
        from torch import nn

        for owner, names, bound in ((nn.Module, MODULE_HOOKS, True), (mm, GLOBAL_HOOKS, False)):
            for name in names:
                original = getattr(owner, name)
                self._saved.append((owner, name, original))
                setattr(owner, name, self._recording(original, name, bound))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _recording(self, original, name: str, bound: bool):
        import functools
        import sys

        @functools.wraps(original)
        def registering(*args, **kwargs):
            module = type(args[0]).__name__ if bound and args else "every module"
            self.sites.append({"call": name, "module": module,
                               "where": caller(sys._getframe(1), self.own)})
            return original(*args, **kwargs)

        return registering


def caller(frame, own: tuple[str, ...] = ()) -> str:
    """"path:line in function" of the innermost frame from `frame` outwards that is the user's
    (not torch's, Python's or ddp_lab's plumbing, nor in `own`); "" if none is."""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        if not any(s in path for s in _LIBRARY + own):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _compile_seconds() -> float:
    """Seconds dynamo has spent compiling frames in this process so far."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))
