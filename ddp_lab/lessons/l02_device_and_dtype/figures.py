"""Lesson 02's pictures: a map of every tensor in the module by rank (where it lives, its dtype
after `.double()`, whether it is registered, whether it matches rank 0), and each tensor's drift
between ranks step by step; broken beside fixed."""
from __future__ import annotations

from matplotlib.ticker import MaxNLocator

from ...course.plots import BROKEN, FIXED, figure, lines

REGISTERED_COLOUR, PLAIN_COLOUR, ODD_COLOUR = "#d5f5e3", "#fadbd8", "#c0392b"


def draw_map(ax, run, which: str) -> None:
    """Rows: the module's tensors; columns: ranks. Each cell: device, dtype after .double(),
    and whether the value equals rank 0's. Green: registered; red: a plain attribute."""
    title = "every tensor by rank"
    if run is None or not run.ok:
        ax.set_title(f"{which}: {title} (run did not finish)")
        ax.set_axis_off()
        return
    maps = [r.value["map"] for r in run.ranks]
    names = [row["name"] for row in maps[0]]
    for col, rows in enumerate(maps):
        for i, row in enumerate(rows):
            colour = REGISTERED_COLOUR if row["registered"] else PLAIN_COLOUR
            ax.add_patch(_rect(col, i, colour))
            agrees = "reference" if col == 0 else ("= rank 0" if row["drift"] == 0 else
                                                   f"≠ rank 0 (by {row['drift']:.2g})")
            text = f"{row['device']} · {row['dtype_after_double']}\n{agrees}"
            odd = row["dtype_after_double"] != "float64" or (col and row["drift"] != 0)
            ax.text(col, i, text, ha="center", va="center", fontsize=8,
                    color=ODD_COLOUR if odd else "black")
    ax.set_xlim(-0.5, len(maps) - 0.5)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xticks(range(len(maps)), [f"rank {r}" for r in range(len(maps))])
    ax.set_yticks(range(len(names)),
                  [f"{row['name']}\n({row['how']})" for row in maps[0]], fontsize=8)
    ax.set_xlabel("rank   (cell: device · dtype after .double();  green: registered,  red: plain)")
    ax.set_title(f"{which}: {title}", color=BROKEN if which == "broken" else FIXED)


def _rect(col, row, colour):
    from matplotlib.patches import Rectangle

    return Rectangle((col - 0.48, row - 0.45), 0.96, 0.9, facecolor=colour, edgecolor="grey")


def draw_drift(ax, run, which: str) -> None:
    series = {}
    if run is not None and run.ok:
        value = run.ranks[0].value
        plain = {row["name"] for row in value["map"] if not row["registered"]}
        series = {f"{n} (plain)" if n in plain else n: d
                  for n, d in value["tensor_drift_per_step"].items()}
        series["the model's output, same batch"] = value["output_gap_per_step"]
    lines(ax, series, title=f"{which}: each tensor, rank 1 against rank 0",
          xlabel="training step (0 = after wrapping)", ylabel="max |t(rank 1) - t(rank 0)|",
          log=True)
    ax.title.set_color(BROKEN if which == "broken" else FIXED)
    ax.set_ylim(-1e-9, 10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def figures(results) -> dict:
    runs = results.get("constant_across_ranks", {})
    out = {}
    for key, draw, title, height in (
            ("tensor_map", draw_map, "Where each tensor of RandomFeatures lives, by rank", 3.4),
            ("constant_drift", draw_drift,
             "A random constant kept as a plain tensor never agrees across ranks", 3.4)):
        fig, axes = figure(2, title=title, height=height)
        for ax, which in zip(axes, ("broken", "fixed")):
            draw(ax, runs.get(which), which)
        out[key] = fig
    return out
