"""Lesson 19's pictures: how far the ranks are apart after each step (max |rank r - rank 0|),
broken beside fixed, one panel per scenario."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure

PANELS = [  # scenario, value key, title, y label
    ("cast_after_wrapping", "drift_per_step", "1. model.double() after DDP(model)",
     "max |Δ| of any parameter"),
    ("head_after_wrapping", "drift_per_step", "1. a head replaced after wrapping\n"
     "(find_unused_parameters=True)", "max |Δ| of any parameter"),
    ("wrapped_some_phases", "drift_per_step", "2. phase 2 trains ddp.module",
     "max |Δ| of any parameter"),
    ("clip_local_norm", "drift_per_step", "3. clipped by each rank's local norm",
     "max |Δ| of norm.weight, norm.bias"),
    ("uneven_all_gather", "error_per_step", "4. all_gather of per-rank lengths",
     "max |gathered - true| (rank 1)"),
    ("read_before_wait", "error_per_step", "5. async all_reduce read before wait()",
     "max |read - true sum| (rank 0)"),
]
BROKEN_LABELS = {"clip_local_norm": "local norm", "wrapped_some_phases": "bare module in phase 2",
                 "read_before_wait": "read, then wait()", "uneven_all_gather": "own-size buffers"}
FIXED_LABELS = {"clip_local_norm": "global norm", "wrapped_some_phases": "wrapper in both phases",
                "read_before_wait": "wait(), then read", "uneven_all_gather": "padded, trimmed"}
RANK_SHOWN = {"uneven_all_gather": 1, "read_before_wait": 0}


def _series(result, key: str, rank: int):
    r = result.ranks[rank]
    return r.value[key] if r.ok and r.value else None


def figures(results) -> dict:
    from matplotlib.ticker import MaxNLocator  # here, not at import: ranks import this package

    shown = [p for p in PANELS if p[0] in results]
    fig, axes = figure(3, 2, width=4.4, height=3.2,
                       title="How far apart the ranks are after each step: broken beside fixed")
    for ax, (name, key, title, ylabel) in zip(axes, shown):
        rank = RANK_SHOWN.get(name, 0)
        for which, colour, labels in (("broken", BROKEN, BROKEN_LABELS), ("fixed", FIXED, FIXED_LABELS)):
            run = results[name].get(which)
            ys = _series(run, key, rank) if run is not None else None
            label = labels.get(name, "changed after wrapping" if which == "broken" else "finished, then wrapped")
            if ys is None:
                outcome = ("rank 0 killed by SIGABRT\n(gloo's size check)"
                           if run is not None and run.ranks[0].status == "crashed"
                           else f"rank {rank}: {run.ranks[rank].status if run else 'not run'}")
                ax.text(0.5, 0.6, f"{which} ({label}):\n{outcome}", transform=ax.transAxes,
                        ha="center", color=colour, fontsize=8)
                continue
            finite = [y if y != float("inf") else None for y in ys]
            ax.plot(range(1, len(ys) + 1), finite, marker="o", ms=4, color=colour, label=label)
            for i, y in enumerate(ys, start=1):
                if y == float("inf"):
                    ax.annotate("wrong length", (i, 0), color=colour, fontsize=7)
        if name == "wrapped_some_phases":
            run = results[name].get("broken") or results[name].get("fixed")
            ax.axvline(run.values[0]["phase_steps"] + 0.5, color="grey", ls=":", lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step (counted from 1)")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    return {"drift_per_step": fig}
