"""Lesson 10's picture: all-reduces, bytes and gradient error per optimiser step."""
from __future__ import annotations


def _bars(ax, series: dict, *, title: str, ylabel: str, log: bool = False) -> None:
    """Grouped bars: one group per optimiser step, one bar per labelled run."""
    from ...course.plots import BROKEN, FIXED

    colours = [BROKEN, FIXED, "#7f8c8d"]
    width = 0.8 / max(len(series), 1)
    for i, (label, ys) in enumerate(series.items()):
        xs = [step + (i - (len(series) - 1) / 2) * width for step in range(len(ys))]
        bars = ax.bar(xs, ys, width, color=colours[i % len(colours)], label=label)
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    steps = max((len(ys) for ys in series.values()), default=0)
    ax.set_xticks(range(steps), [str(s + 1) for s in range(steps)])
    top = max((max(ys) for ys in series.values() if len(ys)), default=1.0)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(top=top * 100)
    else:
        ax.set_ylim(0, top * 1.35)
    ax.set_title(title)
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)


def figures(results) -> dict:
    """All-reduces and bytes per optimiser step with and without no_sync; the gradient's error
    against the large-batch reference with summed and averaged micro-batch losses."""
    from matplotlib.ticker import MaxNLocator

    from ...course.plots import figure

    sync = {w: results["no_sync"][w].ranks[0].value for w in ("broken", "fixed")}
    scale = {w: results["loss_scaling"][w].ranks[0].value for w in ("broken", "fixed")}
    k = sync["broken"]["k"]
    fig, (calls, sent, err) = figure(3, title=f"Gradient accumulation over k={k} micro-batches "
                                              "(rank 0; DDP's all-reduces counted by a comm hook)",
                                     width=4.6)
    runs = {"without no_sync": "broken", "with no_sync": "fixed"}
    _bars(calls, {lab: sync[w]["allreduces_per_step"] for lab, w in runs.items()},
          title="all-reduces per optimiser step", ylabel="all-reduces launched by DDP (count)")
    calls.yaxis.set_major_locator(MaxNLocator(integer=True))
    _bars(sent, {lab: [b / 1024 for b in sync[w]["bytes_per_step"]] for lab, w in runs.items()},
          title="gradient bytes all-reduced per step", ylabel="bucket bytes (KiB)")
    _bars(err, {"losses summed": scale["broken"]["grad_error_per_step"],
                "losses / k": scale["fixed"]["grad_error_per_step"]}, log=True,
          title="gradient vs one large batch", ylabel="max relative error of the gradient")
    return {"allreduces_per_step": fig}
