"""The terminal of `ddp-lab watch train.py` while the script runs: the script's own output as it
runs, then the report.

Each line a rank writes is shown as `torchrun --tee 3` shows it, prefixed with the worker's role
and local rank (`[default0]:`, torch/distributed/elastic/multiprocessing/tail_log.py), on stdout
or stderr as the script wrote it; with `--json`, all of it on stderr, so that stdout holds the
report's JSON alone. `--local-ranks-filter 0` shows rank 0's lines only (torchrun's option of
that name). Beside them, on stderr, the steps each rank has done (`Progress`): rewritten in place
on a terminal, a line every 10 s otherwise.
"""
from __future__ import annotations

import os
import threading
import time

from ...launching.torchrun_world import ROLE

CLEAR = "\r\x1b[K"  # back to the line's start and clear it (a terminal's progress line)


def parse_ranks(text: str | None, nproc: int) -> set[int] | None:
    """`--local-ranks-filter`'s value ("0", "0,1") as a set of ranks; None (all) for None.
    Raises ValueError, saying why, as torchrun refuses a bad one."""
    if text is None:
        return None
    try:
        ranks = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise ValueError(f"--local-ranks-filter must be a comma-separated list of ranks, e.g. "
                         f"0 or 0,1; got {text!r}") from None
    bad = sorted(r for r in ranks if not 0 <= r < nproc)
    if not ranks or bad:
        raise ValueError(f"--local-ranks-filter names no rank of 0..{nproc - 1}: {text!r}")
    return ranks


class Console:
    """Where the script's lines and the progress line go (one lock: never half a line)."""

    def __init__(self, out, err, ranks: set[int] | None = None, json: bool = False):
        self.out, self.err, self.ranks, self.json = out, err, ranks, json
        self.tty = hasattr(err, "isatty") and err.isatty()
        self.lock = threading.Lock()
        self.status = ""  # the progress line shown on a terminal

    def line(self, rank: int, stream: str, text: str) -> None:
        """launch's `output`: one line of the script's, from `rank`'s stdout or stderr."""
        if self.ranks is not None and rank not in self.ranks:
            return
        dst = self.err if self.json or stream == "stderr" else self.out
        text = text if text.endswith("\n") else text + "\n"
        with self.lock:
            if self.status:
                self.err.write(CLEAR)
                self.err.flush()
            dst.write(f"[{ROLE}{rank}]:{text}")
            dst.flush()
            if self.status:
                self.err.write(self.status)
                self.err.flush()

    def progress(self, text: str) -> None:
        with self.lock:
            if self.tty:
                self.status = text
                self.err.write(CLEAR + text)
            else:
                self.err.write(text + "\n")
            self.err.flush()

    def done(self) -> None:
        with self.lock:
            if self.status:
                self.err.write(CLEAR)
                self.err.flush()
                self.status = ""


class Progress:
    """The steps each rank has done, read from the ranks' records while they run."""

    def __init__(self, folder: str, nproc: int, name: str, console: Console):
        self.folder, self.nproc, self.name, self.console = folder, nproc, name, console
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _steps(self) -> list[int]:
        out = []
        for r in range(self.nproc):
            try:
                with open(os.path.join(self.folder, f"rank{r}.jsonl"), "rb") as f:
                    out.append(f.read().count(b'"end":'))
            except OSError:
                out.append(0)
        return out

    def _loop(self) -> None:
        last, shown = None, time.time()  # a run of a few seconds prints nothing
        while not self.stop.wait(0.5):
            steps = self._steps()
            now = time.time()
            if steps != last and now - shown > (1 if self.console.tty else 10):
                self.console.progress(f"watch {self.name}: steps done per rank {steps}")
                last, shown = steps, now

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(2)
        self.console.done()
