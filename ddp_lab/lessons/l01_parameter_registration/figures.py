"""Lesson 01's pictures: per-step drift between the ranks' copies of each tensor, broken beside
fixed (symlog scale: exactly 0 sits at the bottom, 1e-8 and up is logarithmic)."""
from __future__ import annotations

from matplotlib.ticker import MaxNLocator

from ...course.plots import BROKEN, FIXED, figure, lines

YLABEL = "max |t(rank r) - t(rank 0)|"
XLABEL = "training step (0 = after wrapping)"


def tensor_series(run) -> dict:
    """{tensor name: drift per step} from a finished `train` run ({} if it did not finish)."""
    if run is None or not run.ok:
        return {}
    value = run.ranks[0].value
    return {f"{n} (unregistered)" if n in value["unregistered"] else n: d
            for n, d in value["tensor_drift_per_step"].items()}


def draw_pair(axes, results, name: str, what: str) -> None:
    for ax, which, colour in zip(axes, ("broken", "fixed"), (BROKEN, FIXED)):
        series = tensor_series(results.get(name, {}).get(which))
        lines(ax, series, title=f"{which}: {what[which]}", xlabel=XLABEL, ylabel=YLABEL, log=True)
        ax.title.set_color(colour)
        ax.set_ylim(-1e-9, 10)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def figures(results) -> dict:
    title = "How far apart the ranks' copies of each tensor are, step by step"
    fig, axes = figure(2, 2, title=title, height=3.4)
    draw_pair(axes[:2], results, "plain_tensor",
              {"broken": "gain as a plain tensor", "fixed": "gain as nn.Parameter"})
    draw_pair(axes[2:], results, "data_parallel",
              {"broken": "DataParallel in each rank", "fixed": "DistributedDataParallel"})
    return {"parameter_drift": fig}


def drift_report(value: dict) -> str:
    """A `train` run's per-tensor story as text: how far apart the ranks' copies were right after
    wrapping and at the end, and how far the tensor moved on rank 0. * marks unregistered."""
    rows = [f"{'tensor':<20} {'apart after wrap':>16} {'apart at end':>13} {'moved':>8}"]
    for name, d in value["tensor_drift_per_step"].items():
        tag = name + (" *" if name in value["unregistered"] else "")
        rows.append(f"{tag:<20} {d[0]:>16.3g} {d[-1]:>13.3g} {value['moved'][name]:>8.3g}")
    if value["unregistered"]:
        rows.append("* not registered: not in parameters()")
    return "\n".join(rows)


def draw_cost(ax, value: dict) -> None:
    """Bar chart of `find_unused_cost`'s median step times."""
    names = list(value["ms"])
    colours = [FIXED if n == "fixed module" else BROKEN if "find_unused" in n else "#7f8c8d"
               for n in names]
    ax.barh(range(len(names)), [value["ms"][n] for n in names], color=colours)
    ax.set_yticks(range(len(names)), [f"{n}\n(x{value['ratio'][n]:.2f})" for n in names],
                  fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median time of one forward + backward step (ms)")
    ax.set_title("What each fix costs per step (2 ranks, gloo)")
    ax.grid(axis="x", alpha=0.3)
