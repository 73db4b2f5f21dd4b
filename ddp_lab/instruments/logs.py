"""The one rank-aware logger: rank 0 speaks on the console, every rank keeps its own record.

    log = get_logger("train")
    log.info("step %d loss %.4f", step, loss)             # console: rank 0 only
    log.info("shard of %d rows", n, all_ranks=True)       # console: every rank, "[rank N] " first
    log.debug("batch %d took %.3f s", i, dt)              # below the console level: record only

Every rank writes every message at or above `record_level` to its own record, one line each,
`[rank N] HH:MM:SS.mmm LEVEL logger: message`:
- in a rank started by `ddp_lab.launch`, the rank's stderr, which the launcher keeps per rank,
  so `records(result)` reads any rank's log back from the `RunResult`, even a killed rank's;
- with `log_dir` (or the DDP_LAB_LOG_DIR variable), also the file `log_dir/rank{N}.log`
  (read it back with `parse(text)`).
Nothing here touches `print`: code that prints keeps printing on every rank.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass

from ..launching.rankinfo import rank_info

_RECORD = re.compile(r"^\[rank (\d+)\] (\d\d:\d\d:\d\d\.\d{3}) ([A-Z]+) (\S+?): (.*)$")
_MORE = re.compile(r"^\[rank (\d+)\] {5}(.*)$")  # continuation line of a multi-line message


class _Stream(logging.StreamHandler):
    """A handler writing to whatever sys.stdout / sys.stderr is when the message is emitted."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    @property
    def stream(self):
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):
        pass


class _ConsoleFormat(logging.Formatter):
    def format(self, record):
        text = super().format(record)
        return f"[rank {record.ddp_rank}] {text}" if record.all_ranks else text


class _RecordFormat(logging.Formatter):
    def __init__(self):
        super().__init__("%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record):
        first, *more = super().format(record).splitlines() or [""]
        head = f"[rank {record.ddp_rank}] "
        return "\n".join([head + first] + [f"{head}    {line}" for line in more])


class _Defaults(logging.Filter):
    """Give records logged through the plain logging API this rank, and `all_ranks=False`."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record) -> bool:
        record.ddp_rank = getattr(record, "ddp_rank", self.rank)
        record.all_ranks = getattr(record, "all_ranks", False)
        return True


def _console_filter(record) -> bool:
    return record.ddp_rank == 0 or record.all_ranks


class RankLogger(logging.LoggerAdapter):
    """A logger that knows its rank; every logging method takes `all_ranks=False`."""

    def __init__(self, logger: logging.Logger, rank: int):
        super().__init__(logger, {})
        self.rank = rank

    def log(self, level, msg, *args, all_ranks: bool = False, **kwargs):
        if self.isEnabledFor(level):
            extra = {**kwargs.pop("extra", {}), "ddp_rank": self.rank, "all_ranks": all_ranks}
            self.logger.log(level, msg, *args, extra=extra, **kwargs)


def get_logger(name: str = "ddp_lab", *, console_level: int | str = "INFO",
               record_level: int | str = "DEBUG", log_dir: str | None = None) -> RankLogger:
    """The rank-aware logger `name` for this rank (asking again returns the same handlers)."""
    rank = rank_info().rank
    logger = logging.getLogger(name)
    logger.propagate = False  # the root logger's handlers would print on every rank
    for handler in [h for h in logger.handlers if getattr(h, "_ddp_lab", False)]:
        logger.removeHandler(handler)
        handler.close()
    console = _Stream("stdout")
    console.setLevel(_level(console_level))
    console.setFormatter(_ConsoleFormat("%(message)s"))
    handlers = [console]
    if os.environ.get("DDP_LAB_RANK_PROCESS"):  # launched by ddp_lab: stderr is this rank's own
        handlers.append(_Stream("stderr"))
    log_dir = log_dir or os.environ.get("DDP_LAB_LOG_DIR")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        handlers.append(logging.FileHandler(os.path.join(log_dir, f"rank{rank}.log")))
    for handler in handlers[1:]:
        handler.setLevel(_level(record_level))
        handler.setFormatter(_RecordFormat())
    for handler in handlers:
        handler._ddp_lab = True
        handler.addFilter(_Defaults(rank))
        logger.addHandler(handler)
    console.addFilter(_console_filter)
    levels = [_level(console_level)] + [_level(record_level)] * (len(handlers) > 1)
    logger.setLevel(min(levels))
    return RankLogger(logger, rank)


def _level(level: int | str) -> int:
    value = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown logging level {level!r}")
    return value


@dataclass(frozen=True)
class Record:
    """One message of one rank's record."""

    rank: int
    time: str  # HH:MM:SS.mmm, the rank's wall clock
    level: str
    logger: str
    message: str


def parse(text: str) -> list[Record]:
    """The records in `text` (a rank's stderr, or a log_dir file); other lines are skipped."""
    out: list[Record] = []
    for line in text.splitlines():
        if m := _RECORD.match(line):
            out.append(Record(int(m[1]), m[2], m[3], m[4], m[5]))
        elif (m := _MORE.match(line)) and out and out[-1].rank == int(m[1]):
            last = out[-1]
            out[-1] = Record(last.rank, last.time, last.level, last.logger, f"{last.message}\n{m[2]}")
    return out


def records(result, rank: int | None = None, *, logger: str | None = None,
            level: str | None = None) -> list[Record]:
    """Every rank's records from a RunResult (or one RankResult), in rank order; `rank`,
    `logger` and `level` (at least this level) narrow them down."""
    ranks = [result] if hasattr(result, "stderr") else result.ranks
    floor = _level(level) if level else 0
    return [rec for r in ranks if rank is None or r.rank == rank for rec in parse(r.stderr)
            if (logger is None or rec.logger == logger)
            and _level(rec.level) >= floor]


def console(result) -> str:
    """What a shared terminal shows, rank by rank: each rank's stdout, then the lines of its
    stderr that are not records (a terminal interleaves them in whatever order they come)."""
    lines = []
    for r in result.ranks:
        lines += r.stdout.splitlines()
        lines += [ln for ln in r.stderr.splitlines() if not (_RECORD.match(ln) or _MORE.match(ln))]
    return "\n".join(lines)
