"""Lesson 15's picture: per rank and per step, the seconds a compiled DDP step took, the seconds
of it spent compiling, and the same step run eagerly -- broken beside fixed, for the Python
counter (a recompile every step) and for ranks with different batch lengths (one rank
recompiles, the other waits). Compiled with aot_eager: eager kernels, so a compiled step is
never faster here; what the picture shows is what compiling costs and who pays it."""
from __future__ import annotations

from ...plots import BROKEN, FIXED, figure, rank_colour

FLOOR = 1e-4  # seconds: where a step that compiled nothing sits on the log axis
PANELS = (("recompile_every_step", "broken", "int counter (WarmupGate)"),
          ("recompile_every_step", "fixed", "tensor counter (WarmupGateFixed)"),
          ("ranks_compile_different_graphs", "broken", "rank 1's batches: lengths 6, 8, ..."),
          ("ranks_compile_different_graphs", "fixed", "every rank padded to one length"))


def draw_steps(ax, result, title: str, colour: str) -> None:
    """Per rank: compiled step seconds (line), seconds compiling in it (crosses), eager (dashed)."""
    from matplotlib.ticker import MaxNLocator

    for r in result.ranks:
        v, c = r.value, rank_colour(r.rank)
        steps = range(len(v["step_s"]))
        ax.plot(steps, v["step_s"], marker="o", ms=4, color=c, label=f"rank {r.rank}: compiled step")
        ax.plot(steps, [max(s, FLOOR) for s in v["compile_s"]], "x", ms=7, mew=2, color=c,
                label=f"rank {r.rank}: of it compiling")
        ax.plot(steps, v["eager_s"], "--", lw=1, color=c, alpha=0.6, label=f"rank {r.rank}: eager step")
    ax.set_yscale("log")
    ax.set_ylim(FLOOR / 2, None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds (log)")
    ax.set_title(title, fontsize=9, color=colour)
    ax.grid(alpha=0.3)


def figures(results) -> dict:
    fig, axes = figure(2, nrows=2, width=5.4, height=3.4, sharey=True,
                       title="Compiled DDP steps per rank (aot_eager): compile time, step time, eager")
    for ax, (name, which, title) in zip(axes, PANELS):
        draw_steps(ax, results[name][which], f"{which}: {title}", BROKEN if which == "broken" else FIXED)
    axes[0].legend(fontsize=6, ncol=2, loc="upper right")
    return {"compile_and_step_time": fig}
