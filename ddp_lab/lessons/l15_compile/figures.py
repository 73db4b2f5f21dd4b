"""Lesson 15's picture: per rank and per step, the seconds a compiled DDP step took, the seconds
of it spent compiling, and the same step run eagerly -- broken beside fixed, for the Python
counter (a recompile every step) and for ranks with different batch lengths (one rank
recompiles, the other waits). Compiled with aot_eager: eager kernels, so once compiled a step
costs about what the eager one does (both move with the machine's load); what the picture shows
is what compiling costs and who pays it."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, rank_colour

PANELS = (("recompile_every_step", "broken", "int counter (WarmupGate)"),
          ("recompile_every_step", "fixed", "tensor counter (WarmupGateFixed)"),
          ("ranks_compile_different_graphs", "broken", "rank 1's batches: lengths 6, 8, ..."),
          ("ranks_compile_different_graphs", "fixed", "every rank padded to one length"))


def draw_steps(ax, result, title: str, colour: str) -> None:
    """Per rank: compiled step seconds (line), seconds compiling in it (a cross, only on the
    steps that compiled something: no cross, nothing compiled), the eager step (dashed). A rank
    that compiled nothing in a step where another rank compiled is marked: it waited."""
    from matplotlib.ticker import MaxNLocator

    for r in result.ranks:
        v, c = r.value, rank_colour(r.rank)
        steps = range(len(v["step_s"]))
        ax.plot(steps, v["step_s"], marker="o", ms=4, color=c, label=f"rank {r.rank}: compiled step")
        compiled = [(step, s) for step, s in zip(steps, v["compile_s"]) if s > 0]
        ax.plot([step for step, _ in compiled], [s for _, s in compiled], "x", ms=7, mew=2, color=c,
                label=f"rank {r.rank}: compiling, in that step")
        ax.plot(steps, v["eager_s"], "--", lw=1, color=c, alpha=0.6, label=f"rank {r.rank}: eager step")
    _mark_waits(ax, result)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds (log)")
    ax.set_title(title, fontsize=9, color=colour)
    ax.grid(alpha=0.3)


def _mark_waits(ax, result) -> None:
    values = [r.value for r in result.ranks]
    for step in range(1, len(values[0]["compile_s"])):
        compiled = [v["compile_s"][step] > 0 for v in values]
        for rank, v in enumerate(values):
            if any(compiled) and not compiled[rank]:
                ax.annotate(f"rank {rank} compiles nothing,\nwaits for the others", fontsize=7,
                            xy=(step, v["step_s"][step]), xytext=(25, -45), textcoords="offset points",
                            arrowprops={"arrowstyle": "->", "color": rank_colour(rank)})


def figures(results) -> dict:
    fig, axes = figure(2, nrows=2, width=5.4, height=3.4, sharey=True,
                       title="Compiled DDP steps per rank (aot_eager): compile time, step time, eager")
    for ax, (name, which, title) in zip(axes, PANELS):
        draw_steps(ax, results[name][which], f"{which}: {title}", BROKEN if which == "broken" else FIXED)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=8)
    return {"compile_and_step_time": fig}
