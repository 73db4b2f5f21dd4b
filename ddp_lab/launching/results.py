"""Plain records of a launch: one `RankResult` per rank, gathered in a `RunResult`.

These are dataclasses that pickle without torch.distributed, so a run can be saved and reloaded.
Their text form is deterministic (no times, ports, PIDs, addresses or machine paths), so a
notebook that displays one can be compared by nbval.
"""
from __future__ import annotations

import pickle
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from .frames import FRAME, launchers, main_thread_frames, without_passing_threads
from .sanitize import sanitize
from .display import run_result_html

# A rank's status, plain strings (so results pickle and print as before), mildest first:
OK = "ok"            # the function returned
ERROR = "error"      # it raised a Python exception
TIMEOUT = "timeout"  # the launcher stopped it (its time was up, or a peer had failed)
CRASHED = "crashed"  # the process died without a Python exception (a signal, os._exit)
STATUSES = (OK, ERROR, TIMEOUT, CRASHED)
INTERRUPTED = "interrupted (KeyboardInterrupt in the launching process)"  # a stopped rank's note
SIMULTANEOUS = 0.1  # seconds: failures closer than this are not ordered by time
_SEVERITY = {status: i for i, status in enumerate(STATUSES)}

# Errors a rank raises because a peer died or stopped, not because of its own bug.
_COLLATERAL = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                         r"ECONNRESET|EPIPE|communicator was aborted|Socket Timeout|"
                         r"failed to recv|failed to send", re.I)
# gloo's "Timed out waiting Nms for recv operation" is NOT here: it is the rank's own process-group
# timeout, with its peer alive elsewhere (a slow save, another collective): the cause to headline.


# A rule framing a message, as torchrun's ChildFailedError summary has.
_RULE = re.compile(r"[=\-]{3,}")


# Innermost frames that name no place: decorators' wrappers, and a handle's wait (DeepSpeed's
# ZeRO-3 parameter fetch is `fetch_sub_module` -> `wait` -> `wrapped_fn`).
_GENERIC = {"wrapped_fn", "wrapper", "decorate_context", "inner", "_fn", "wait"}


def peer_gone(message: str) -> bool:
    """True when an error's first line only says that a peer went away (gloo's "Connection
    closed by peer" and the like): a consequence of another rank's failure, not a cause."""
    first = next((ln for ln in message.strip().splitlines() if ln.strip()), "")
    return bool(_COLLATERAL.search(first))


def signal_name(exitcode: int | None) -> str | None:
    """`-11` (as subprocess reports a signal) -> "SIGSEGV"; None for a normal exit."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


@dataclass
class ErrorInfo:
    """The real exception a rank raised: its class name, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""

    @property
    def first_line(self) -> str:
        """The message's first line that says something: a rule of `=` or `-` is skipped, so
        torchrun's ChildFailedError, a table framed by rules
        (torch/distributed/elastic/multiprocessing/errors/__init__.py:193-202), reads
        "<script> FAILED". Its root cause is not added: torchrun picks it by whole-second time
        stamps, and on a tie by order (`get_first_failure`), which is not a rule a headline can
        repeat run after run."""
        lines = [ln for ln in self.message.strip().splitlines()
                 if ln.strip() and not _RULE.fullmatch(ln.strip())]
        return lines[0] if lines else ""

    def __str__(self) -> str:
        return f"{self.type}: {self.first_line}"


@dataclass
class RankResult:
    """What one rank did: its status, return value or error, output, and stack if it hung."""

    rank: int
    status: str
    value: Any = None
    error: ErrorInfo | None = None
    stdout: str = ""
    stderr: str = ""
    stack: str = ""
    exitcode: int | None = None
    seconds: float = 0.0
    failed_at: float | None = None  # wall-clock time of the failure, for root-cause ordering
    note: str = ""  # why the launcher stopped this rank, when it did
    # What the flight recorder saw this rank enter (ddp_lab.launching.flight.Collective, oldest first);
    # None when it left no record.
    collectives: list | None = None
    native_stack: str = ""  # py-spy's native stack when it hung (launch(native_stacks=True))
    # What the rank cost (ddp_lab.launching.costs): its peak resident memory in MiB when it ended, and the
    # steps it marked with ddp_lab.measured_step() (StepRecord); None: no record.
    peak_rss_mb: float | None = None
    steps: list | None = None

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: use one of {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def signal(self) -> str | None:
        return signal_name(self.exitcode)

    @property
    def headline(self) -> str:
        """One deterministic line: what happened on this rank."""
        if self.status == OK:
            return "ok"
        if self.status == ERROR and self.error:
            if peer_gone(self.error.message):
                # gloo words this differently from run to run; what matters is the same
                return f"{self.error.type}: lost its connection to a peer (a consequence)"
            return sanitize(str(self.error))
        if self.status == CRASHED:
            if self.signal:
                return f"killed by {self.signal}"
            return f"exited with status {self.exitcode} without a Python exception"
        if self.status == TIMEOUT:
            where = self.stuck_in()
            what = "interrupted" if self.note == INTERRUPTED else "timed out"
            return f"{what}{' in ' + where if where else ''}"
        return self.status

    @property
    def is_collateral(self) -> bool:
        """True when this rank failed because another did: stopped by the launcher, or an error
        that only says a peer went away."""
        if self.note:
            return True
        return bool(self.error and peer_gone(self.error.message))

    def step_collectives(self) -> list:
        """The collectives each marked step entered (None: dropped from the recorder's ring)."""
        from .costs import step_collectives

        return step_collectives(self.collectives, self.steps, self.rank)

    def collectives_per_step(self, op: str | None = None) -> list:
        """How many collectives (of `op`, e.g. "all_reduce") each marked step entered."""
        from .costs import collectives_per_step

        return collectives_per_step(self.collectives, self.steps, op, self.rank)

    def stuck_in(self) -> str:
        """The innermost torch.distributed call in the main thread's stack, if any."""
        frames = main_thread_frames(self.stack)
        for filename, func in frames:  # most recent call first
            if "torch/distributed" in filename and not func.startswith(("wrapper", "_")):
                return f"{func}()"
        if frames and frames[0][1] in _GENERIC:  # a decorator's or a wait's name says nothing
            named = [f for _, f in frames if f not in _GENERIC and not f.startswith("_")]
            return named[0] + "()" if named else ""
        return frames[0][1] + "()" if frames else ""

    def stack_text(self, limit: int = 8) -> str:
        """The main thread's innermost `limit` frames when the rank was stopped (see
        `frames_text`)."""
        return frames_text(self.stack, limit)

    def stack_summary(self) -> str:
        """The stack dump, sanitized, without the launcher's own frames below the function."""
        keep = [line for line in without_passing_threads(self.stack).splitlines()
                if not ((m := FRAME.search(line)) and launchers(m[1], m[3]))]
        return sanitize("\n".join(keep).strip())


def _shape(headline: str) -> str:
    """A headline with its numbers blanked: `device_ids [0]` and `[1]` are the same failure."""
    return re.sub(r"\d+", "N", headline)


def frames_text(stack: str, limit: int = 8) -> str:
    """The innermost `limit` frames of the main thread in a faulthandler dump (a stopped rank's
    `.stack`, or a crashed rank's stderr), most recent call first, one `function  (file)` a
    line, the launcher's own frames left out: no line numbers, so it reads the same every run."""
    frames = [(f, fn) for f, fn in main_thread_frames(stack)
              if not f.startswith("<frozen") and not launchers(f, fn)]
    return "\n".join(f"  {fn}  ({sanitize(f)})" for f, fn in frames[:limit])


class DistributedRunError(RuntimeError):
    """A launch did not end "ok"; the message names the root-cause rank first."""

    def __init__(self, result: "RunResult"):
        self.result = result
        super().__init__(result.describe_failure())


class LaunchInterrupted(KeyboardInterrupt):
    """The launching process was interrupted (Ctrl-C, Jupyter's stop button) during a launch.
    Every rank was stopped; `result` holds what each did so far (output, stacks)."""

    def __init__(self, result: "RunResult"):
        self.result = result
        super().__init__("launch interrupted: every rank stopped; their output and stacks so "
                         "far are in this exception's .result")

    def _render_traceback_(self) -> list[str]:
        """IPython (a notebook, the stop button) shows this instead of a traceback through the
        launcher: the ranks' output and stacks so far, then one line. The cell still fails."""
        from .display import INTERRUPTED_LINE, show_interrupted

        show_interrupted(self.result, INTERRUPTED)
        return [f"{type(self).__name__}: {INTERRUPTED_LINE}"]


@dataclass
class RunResult:
    """A whole launch. `status` is the worst rank's: crashed > timeout > error > ok."""

    ranks: list[RankResult]
    backend: str = "gloo"
    timeout: float = 0.0
    seconds: float = 0.0
    label: str = ""
    # The launches that ran before this one in a scenario of several (a job, then its restart:
    # lesson 17), oldest first; empty for a single launch.
    earlier: list["RunResult"] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def status(self) -> str:
        return max((r.status for r in self.ranks), key=_SEVERITY.__getitem__, default=OK)

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.ranks]

    @property
    def failures(self) -> list[RankResult]:
        """Failed ranks, root cause first: errors and crashes by the time they happened, then
        ranks the launcher had to stop."""
        bad = [r for r in self.ranks if not r.ok]
        own = [r.failed_at for r in bad if not r.is_collateral and r.failed_at] or \
            [r.failed_at for r in bad if r.failed_at]
        first = min(own, default=0.0)

        def when(r: RankResult) -> float:
            # Failures within SIMULTANEOUS of the first are a tie, broken by rank: which of two
            # ranks that fail on their own at once "came first" is noise, not evidence.
            t = r.failed_at if r.failed_at is not None else float("inf")
            return 0.0 if t - first < SIMULTANEOUS else t
        return sorted(bad, key=lambda r: (r.is_collateral, when(r), r.rank))

    @property
    def root_cause(self) -> RankResult | None:
        failures = self.failures
        return failures[0] if failures else None

    def _root_is_distinct(self) -> bool:
        """A root cause is worth pointing at when other ranks failed differently after it."""
        root = self.root_cause
        if not root or root.status not in (ERROR, CRASHED):
            return False
        others = self.failures[1:]
        later = [r for r in others if r.is_collateral or r.failed_at is None
                 or r.failed_at - (root.failed_at or 0.0) >= SIMULTANEOUS]
        return bool(later) and any(_shape(r.headline) != _shape(root.headline) for r in others)

    def describe_failure(self) -> str:
        if self.ok:
            return "all ranks ok"
        root = self.root_cause
        if returned := self.returned_while():
            # No rank failed on its own: the one that returned left a collective unfinished.
            lines = [f"{returned}: a collective needs every rank of the group"]
            lines += [f"then rank {r.rank}: {r.headline}" for r in self.failures]
        else:
            lines = [f"rank {root.rank} failed first: {root.headline}"]
            lines += [f"then rank {r.rank}: {r.headline}" for r in self.failures[1:]]
        lines += [p] if (p := self.divergence()) else []
        if root.error and root.error.traceback:
            lines += ["", f"traceback of rank {root.rank}:", sanitize(root.error.traceback)]
        elif root.stack:
            lines += ["", f"stack of rank {root.rank}:", root.stack_summary()]
        return "\n".join(lines)

    def raise_for_status(self) -> "RunResult":
        if not self.ok:
            raise DistributedRunError(self)
        return self

    def output(self, stream: str = "stdout") -> str:
        """Every rank's output, in rank order, each line prefixed `[rank N]`."""
        out = []
        for r in self.ranks:
            for line in getattr(r, stream).splitlines():
                out.append(f"[rank {r.rank}] {line}")
        return "\n".join(out)

    def print_output(self, stream: str = "stdout") -> None:
        text = self.output(stream)
        if text:
            print(sanitize(text))

    def save(self, path) -> None:
        with open(path, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load(path) -> "RunResult":
        with open(path, "rb") as f:
            return pickle.load(f)

    def __repr__(self) -> str:
        head = f"RunResult({self.label + ': ' if self.label else ''}{self.status}, "
        head += f"world_size={self.world_size}, backend={self.backend})"
        rows = [head]
        for r in self.ranks:
            what, mark = self.what_happened(r)
            rows.append(f"  rank {r.rank}: {r.status:<8} {what}{'  <- ' + mark if mark else ''}".rstrip())
        if self.status == "timeout" and (p := self.divergence()):
            rows.append(f"  {p}")
        return "\n".join(rows)

    def divergence(self) -> str:
        """Where the flight recorder saw the ranks part ('' when they did not, or no record)."""
        from .divergence import describe

        return describe(self.ranks)

    def returned_while(self) -> str:
        """'rank 1 returned while rank 0 was in all_reduce()' when no rank failed on its own and
        a rank that returned left the others in a collective; '' otherwise."""
        from .divergence import describe_returned

        return "" if self.ok else describe_returned(self.ranks)

    def what_happened(self, r: RankResult) -> tuple[str, str]:
        """(rank `r`'s line in the per-rank table, "root cause" or '')."""
        if r.ok:
            returned, _ = self._returned()
            if r.rank not in returned:
                return "", ""
            return "returned while" + self.returned_while().split(" returned while", 1)[1], "root cause"
        distinct = self.root_cause is r and self._root_is_distinct() and not self._returned()[0]
        return r.headline, "root cause" if distinct else ""

    def _returned(self):
        from .divergence import returned_while

        return ([], {}) if self.ok else returned_while(self.ranks)

    def costs(self):
        """Per rank: peak memory, memory over the marked steps, collectives per step
        (`ddp_lab.launching.costs.CostReport`: text, and a table in Jupyter)."""
        from .costs import CostReport

        return CostReport(self)

    def _repr_html_(self) -> str:
        return run_result_html(self)
