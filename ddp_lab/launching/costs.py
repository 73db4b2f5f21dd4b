"""What a rank costs, step by step: its memory and the collectives each step entered.

A rank marks its steps with `ddp_lab.measured_step()`; the launcher brings them back as
`RankResult.steps` (one `StepRecord` each), beside `RankResult.peak_rss_mb` (the process's peak
resident memory) and `RankResult.collectives` (PyTorch's flight recorder). This module reads
them: the collectives of each step, how many per step, and a per-rank report. Plain data, no
torch: it works on a saved and reloaded `RunResult`.

    result = ddp_lab.launch(train, timeout=60)        # every launch records collectives (flight.py)
    result.ranks[0].collectives_per_step()            # [1, 3, 1, 1]
    result.ranks[0].collectives_per_step("all_reduce")
    [s.peak_mb for s in result.ranks[0].steps]        # MiB, the highest RSS inside each step
    result.costs()                                    # a table per rank (text, and HTML in Jupyter)
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from statistics import median

WORLD = "0"  # the flight recorder's name for the default (world) process group


@dataclass(frozen=True)
class ChildMemory:
    """A child process of the rank (a DataLoader worker, say), measured at the end of a step."""

    pid: int
    rss_mb: float      # resident: counts pages it shares with the rank (after fork) in full
    private_mb: float  # resident and mapped by this process alone: what it costs on its own


@dataclass(frozen=True)
class StepRecord:
    """One step a rank marked with `measured_step()`. Times are wall-clock seconds; memory in
    MiB, read from /proc (Linux)."""

    start: float
    end: float
    rss_start_mb: float          # resident memory when the step began
    rss_mb: float                # ... when it ended
    peak_mb: float               # the highest resident memory inside the step (Linux); where
    #                              the peak cannot be reset, the process's peak so far
    seq_start: int | None = None  # collectives the world group had entered when the step began
    seq_end: int | None = None    # ... when it ended (None: no process group)
    children: tuple = ()          # ChildMemory of each child process alive at the step's end

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def growth_mb(self) -> float:
        """How far resident memory rose inside the step, above where it began."""
        return self.peak_mb - self.rss_start_mb


def from_records(records) -> list[StepRecord] | None:
    """The rank's plain step dicts (as the rank, child.py, writes them) -> StepRecords; None for None."""
    if records is None:
        return None
    return [StepRecord(**{**r, "children": tuple(ChildMemory(**c) for c in r.get("children", ()))})
            for r in records]


def step_collectives(collectives, steps, rank: int | str = "?") -> list[list | None]:
    """The collectives each step entered, in order; None for a step whose collectives the flight
    recorder no longer holds (its ring buffer keeps the newest `TORCH_FR_BUFFER_SIZE`).

    The world group's collectives are placed by sequence number (the step recorded how many the
    group had entered when it began and ended); another group's by the time the rank entered
    them (Linux: the recorder's clock is the wall clock)."""
    if steps is None:
        raise ValueError(f"rank {rank} marked no steps: wrap each step of its loop in "
                         "`with ddp_lab.measured_step():`")
    if collectives is None:
        raise ValueError(f"rank {rank} left no flight record: it made no process group, or "
                         "recording was off (TORCH_FR_BUFFER_SIZE or TORCH_NCCL_TRACE_BUFFER_SIZE "
                         "set to 0; torch records 2000 collectives when neither is set)")
    world = [c for c in collectives if c.group == WORLD]
    others = [c for c in collectives if c.group != WORLD]
    oldest = min((c.seq for c in world), default=None)
    out = []
    for s in steps:
        if s.seq_start is None:
            mine = [c for c in collectives if s.start <= c.created <= s.end]
        elif oldest is not None and oldest > 1 and s.seq_start + 1 < oldest:
            mine = None  # entries of this step were dropped from the ring buffer
        else:
            mine = [c for c in world if s.seq_start < c.seq <= s.seq_end]
            mine += [c for c in others if s.start <= c.created <= s.end]
        out.append(mine)
    return out


def collectives_per_step(collectives, steps, op: str | None = None,
                         rank: int | str = "?") -> list[int | None]:
    """How many collectives (of `op`, e.g. "all_reduce", when given) each step entered."""
    return [None if cs is None else sum(1 for c in cs if op is None or c.op == op)
            for cs in step_collectives(collectives, steps, rank)]


_ITEM_BYTES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2,
               "uint8": 1, "int8": 1, "bool": 1}


def output_bytes(collective) -> int:
    """The bytes a collective wrote into this rank's output tensors, from the shapes the flight
    recorder kept (an all_reduce: its buffer; a gather: every rank's tensor on the destination,
    nothing elsewhere)."""
    total = 0
    for shape, dtype in zip(collective.out_sizes, collective.out_dtypes):
        n = 1
        for d in shape:
            n *= d
        total += n * _ITEM_BYTES.get(dtype, 4)
    return total


def output_bytes_per_step(collectives, steps, rank: int | str = "?") -> list[int | None]:
    """The bytes the collectives of each step wrote into this rank's output tensors."""
    return [None if cs is None else sum(output_bytes(c) for c in cs)
            for cs in step_collectives(collectives, steps, rank)]


def _runs(counts: list[str], shortest: int = 4) -> str:
    """Counts per step, a run of `shortest` or more equal ones written once: "0 in each of 40
    steps" when every step has the same count, "1 3 2x5 1" within a row (40 zeros read as noise)."""
    if len(counts) >= shortest and len(set(counts)) == 1:
        return f"{counts[0]} in each of {len(counts)} steps"
    out, i = [], 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out += [f"{counts[i]}x{j - i}"] if j - i >= shortest else counts[i:j]
        i = j
    return " ".join(out)


class CostReport:
    """Per rank: peak resident memory, resident memory over the marked steps, the largest child
    process, and collectives per step. Text in a terminal, a table in Jupyter. Memory figures
    are this machine's: print them in a notebook only through a sanitizer or a plot."""

    def __init__(self, result):
        self.result = result

    def rows(self) -> list[dict]:
        out = []
        for r in self.result.ranks:
            steps = r.steps or []
            per_step = []
            try:
                per_step = collectives_per_step(r.collectives, r.steps, rank=r.rank)
            except ValueError:  # no steps, or no flight record
                pass
            private = [c.private_mb for s in steps for c in s.children]
            out.append({
                "rank": r.rank, "peak_mb": r.peak_rss_mb, "steps": len(steps),
                "rss_first_mb": steps[0].rss_mb if steps else None,
                "rss_last_mb": steps[-1].rss_mb if steps else None,
                "step_growth_mb": max((s.growth_mb for s in steps), default=None),
                "step_seconds": median(s.seconds for s in steps) if steps else None,
                "child_private_mb": max(private, default=None),
                "collectives_per_step": per_step})
        return out

    @staticmethod
    def _cells(row: dict) -> list[str]:
        def mb(v):
            return "-" if v is None else f"{v:.0f} MiB"
        counts = _runs(["?" if c is None else str(c) for c in row["collectives_per_step"]])
        rss = f"{mb(row['rss_first_mb'])} -> {mb(row['rss_last_mb'])}" if row["steps"] else "-"
        return [f"rank {row['rank']}", mb(row["peak_mb"]), str(row["steps"]), rss,
                mb(row["step_growth_mb"]), mb(row["child_private_mb"]), counts or "-"]

    HEADS = ("rank", "peak RSS", "steps", "RSS first -> last step", "largest rise in a step",
             "largest child (private)", "collectives per step")

    def __repr__(self) -> str:
        run = self.result
        lines = [f"costs per rank ({run.label or 'run'}, world_size={run.world_size})"]
        for row in self.rows():
            cells = self._cells(row)
            lines.append(f"  {cells[0]}: "
                         + "; ".join(f"{h} {c}" for h, c in zip(self.HEADS[1:], cells[1:])))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f'<th style="text-align:left">{h}</th>' for h in self.HEADS)
        body = "".join("<tr>" + "".join(f'<td style="text-align:left">{html.escape(c)}</td>'
                                        for c in self._cells(row)) + "</tr>" for row in self.rows())
        title = html.escape(f"costs per rank: {self.result.label or 'run'}, "
                            f"world_size={self.result.world_size}")
        return (f"<div><b>{title}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table></div>")
