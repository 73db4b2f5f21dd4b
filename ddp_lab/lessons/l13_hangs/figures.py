"""Lesson 13's figure: each rank's recorded collectives (from the flight recorder) along their
sequence numbers, the collective where the ranks part marked, broken beside fixed."""
from __future__ import annotations

from ...launching.divergence import find
from ...course.plots import BROKEN, FIXED, figure

PANELS = (("rank0_evaluation", "1. rank-0 evaluation through DDP"),
          ("slow_rank0_save", "2. slow rank-0 save"),
          ("uneven_steps", "3. early stopping per rank"),
          ("mismatched_broadcast", "4. broadcast of mismatched size"))
MARKERS = {"all_reduce": "o", "broadcast": "s", "barrier": "D"}
LAST = 8  # collectives shown per panel: the last ones, up to where the ranks part
LABEL_PT = 9  # point labels and notes: readable where the figure is shown at its width


def _label(c) -> str:
    """A point's label: its tensor's shape (the marker says the op; the legend, which is which),
    the dtype on a second line when it is not float32; a barrier carries no tensor."""
    if c.op == "barrier" or not c.shape or c.shape == "no tensor":
        return ""
    shape, _, dtype = c.shape.partition("]")  # "[2, 8] float32"
    dtype = dtype.strip()
    return shape + "]" if dtype in ("", "float32") else f"{shape}]\n{dtype}"


def draw_timeline(ax, result, title: str, colour: str) -> None:
    """One row per rank, one marker per recorded collective (marker: op, label: its tensor)."""
    ranks = [r for r in result.ranks if r.collectives is not None]
    parting = find(result.ranks)
    top = max((c.seq for r in ranks for c in r.collectives), default=0)
    end = min(top, parting.seq + 1) if parting else top
    for r in ranks:
        for c in r.collectives:
            if end - LAST < c.seq <= end and c.group == "0":  # the default group
                ax.scatter(c.seq, r.rank, marker=MARKERS.get(c.op, "^"), s=70, color=colour,
                           edgecolor="black", linewidth=0.5, zorder=3)
                ax.annotate(_label(c), (c.seq, r.rank), textcoords="offset points", xytext=(0, 7),
                            ha="center", va="bottom", fontsize=LABEL_PT, linespacing=1.0)
    if parting:  # between the last collective the ranks agree on and the one where they part
        ax.axvline(parting.seq - 0.5, color=BROKEN, linestyle="--", linewidth=1.5)
        ax.text(parting.seq - 0.5, -0.45, f" the ranks part at #{parting.seq} ({parting.kind})",
                color=BROKEN, fontsize=LABEL_PT, va="bottom")
    ax.set_ylim(-0.5, len(result.ranks) - 0.05)
    ax.set_yticks(range(len(result.ranks)), [f"rank {r.rank}" for r in result.ranks])
    left = max(0.5, end - LAST + 0.5)
    ax.set_xlim(min(left, parting.seq - 0.9) if parting else left, end + 0.8)
    gap = entry_gap(result, end)
    if gap > 1.0:  # a rank entered the last collective seconds after another: it was elsewhere
        ax.text(end, -0.45, f"entered {gap:.0f} s apart ", color=BROKEN, fontsize=LABEL_PT,
                va="bottom", ha="right")
    ax.set_xticks(range(max(1, end - LAST + 1), end + 1))  # sequence numbers are whole
    ax.set_xlabel("collective sequence number (flight recorder)")
    ax.set_title(title, fontsize=10, color=colour)
    ax.grid(axis="x", alpha=0.3)


def entry_gap(result, seq: int | None = None) -> float:
    """Seconds between the first and the last rank entering collective #seq of the default
    group (default: the last one every rank recorded), from the flight recorder's timestamps;
    0 unless every rank that left a record entered it."""
    records = [[c for c in r.collectives if c.group == "0"] for r in result.ranks if r.collectives]
    if len(records) < 2 or not all(records):
        return 0.0
    seq = seq or min(rec[-1].seq for rec in records)
    times = [c.created for rec in records for c in rec if c.seq == seq]
    return max(times) - min(times) if len(times) == len(records) else 0.0


def figures(results) -> dict:
    from matplotlib.lines import Line2D

    fig, axes = figure(2, nrows=len(PANELS), width=6.4, height=2.5,
                       title="Each rank's recorded collectives: where the ranks part, broken beside fixed")
    fig.legend([Line2D([], [], marker=m, linestyle="", color="grey", markeredgecolor="black")
                for m in MARKERS.values()],
               ["all_reduce", "broadcast", "barrier (no tensor)"], loc="outside lower center",
               ncols=len(MARKERS), title="a point's label: its tensor's shape, and dtype if not float32",
               title_fontsize=LABEL_PT,
               fontsize=LABEL_PT, frameon=False)
    for row, (name, title) in enumerate(PANELS):
        for col, which in enumerate(("broken", "fixed")):
            draw_timeline(axes[2 * row + col], results[name][which], f"{title}: {which}",
                          BROKEN if which == "broken" else FIXED)
    return {"collective_timelines": fig}
