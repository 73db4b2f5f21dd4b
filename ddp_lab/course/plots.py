"""Figures shared by the lessons: broken beside fixed, one colour per rank, labelled axes.

Functions here take plain data (lists, dicts of numbers) that a rank returned; they never run
anything. Each returns a matplotlib Figure (using the non-interactive Agg canvas when no display
is set up), so the tour can save it as PNG and a notebook can show it.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
BROKEN, FIXED = "#c0392b", "#27ae60"


def show_figures_in_ipython() -> None:
    """Let IPython draw a pyplot-free Figure as a PNG (pyplot registers this only when imported)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
        from matplotlib.figure import Figure
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        formatter = shell.display_formatter.formatters["image/png"]
        formatter.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


def figure(ncols: int = 2, nrows: int = 1, title: str = "", width: float = 5.2, height: float = 3.6,
           sharey: bool = False):
    """A new Figure with `nrows` x `ncols` axes (a flat list of axes is returned with it)."""
    from matplotlib.figure import Figure

    show_figures_in_ipython()

    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=sharey, squeeze=False).ravel().tolist()
    if title:
        fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, axes


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def per_rank_lines(ax, series: Sequence[Sequence[float]], *, title: str, xlabel: str, ylabel: str,
                   log: bool = False, marker: str = "o") -> None:
    """One line per rank: `series[rank][step]`."""
    for rank, ys in enumerate(series):
        ax.plot(range(len(ys)), ys, marker=marker, ms=3, color=rank_colour(rank), label=f"rank {rank}")
    _finish(ax, title, xlabel, ylabel, log)


def lines(ax, named: Mapping[str, Sequence[float]], *, title: str, xlabel: str, ylabel: str,
          log: bool = False, colours: Mapping[str, str] | None = None) -> None:
    """One line per name: `named[label][step]`."""
    for i, (label, ys) in enumerate(named.items()):
        colour = (colours or {}).get(label, RANK_COLOURS[i % len(RANK_COLOURS)])
        ax.plot(range(len(ys)), ys, marker="o", ms=3, color=colour, label=label)
    _finish(ax, title, xlabel, ylabel, log)


def broken_beside_fixed(draw: Callable, broken, fixed, *, title: str, sharey: bool = True, **kw):
    """A two-panel figure: `draw(ax, data, "broken"|"fixed")` on each side."""
    fig, (left, right) = figure(2, title=title, sharey=sharey, **kw)
    draw(left, broken, "broken")
    draw(right, fixed, "fixed")
    left.set_title(f"broken: {left.get_title()}" if left.get_title() else "broken", color=BROKEN)
    right.set_title(f"fixed: {right.get_title()}" if right.get_title() else "fixed", color=FIXED)
    return fig


def gantt(ax, spans_by_rank: Sequence[Sequence[tuple[str, float, float]]], *, title: str,
          colours: Mapping[str, str] | None = None, xlabel: str = "time since start (s)") -> None:
    """Per-rank timeline: `spans_by_rank[rank] = [(name, start_s, end_s), ...]`, one row per rank."""
    names = sorted({s[0] for spans in spans_by_rank for s in spans})
    palette = {n: (colours or {}).get(n, RANK_COLOURS[(i + 2) % len(RANK_COLOURS)]) for i, n in enumerate(names)}
    for rank, spans in enumerate(spans_by_rank):
        for name, start, end in spans:
            ax.barh(rank, max(end - start, 1e-4), left=start, height=0.6, color=palette[name],
                    edgecolor="black", linewidth=0.4)
    ax.set_yticks(range(len(spans_by_rank)), [f"rank {r}" for r in range(len(spans_by_rank))])
    if not ax.yaxis_inverted():  # shared y axes are inverted once for all
        ax.invert_yaxis()
    handles = [_patch(palette[n]) for n in names]
    if names:
        ax.legend(handles, names, loc="lower right", fontsize=8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)


def _patch(colour):
    from matplotlib.patches import Patch

    return Patch(color=colour)


def _finish(ax, title, xlabel, ylabel, log) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs: whole numbers
    if log:
        ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
