"""The picture of lesson 04: loss and zero gradients under each precision, and the scale a
GradScaler chooses step by step."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, lines

COLOURS = {"fp32": "#34495e", "bf16": "#2980b9", "fp16": BROKEN, "fp16 + GradScaler": FIXED}


def precision_runs(results) -> dict:
    """Rank 0's run of every precision, from the fp16_underflow scenario's broken and fixed runs."""
    underflow = results["fp16_underflow"]
    runs = dict(underflow["broken"].ranks[0].value["runs"])
    runs.update(underflow["fixed"].ranks[0].value["runs"])
    return runs


def draw_precisions(runs: dict):
    """Loss, zero-gradient fraction and loss scale against step, one line per precision."""
    fig, (loss_ax, zero_ax, scale_ax) = figure(3, title="float32, bfloat16 and float16 training "
                                               "of the same decoder (DDP, 2 ranks; rank 0 shown)")
    colours = {name: COLOURS.get(name, "grey") for name in runs}
    lines(loss_ax, {n: r["loss"] for n, r in runs.items()}, title="loss", xlabel="training step",
          ylabel="mean squared error (log scale)", colours=colours)
    loss_ax.set_yscale("log")
    lines(zero_ax, {n: [100 * f for f in r["zero_fraction"]] for n, r in runs.items()},
          title="gradient elements that are exactly 0", xlabel="training step",
          ylabel="share of gradient elements (%)", colours=colours)
    for ax in (loss_ax, zero_ax):  # float32 drawn wide and pale, so the lines on it show
        for line in ax.get_lines():
            if line.get_label() == "fp32":
                line.set(linewidth=6, alpha=0.35, marker="")
        ax.legend(fontsize=8)
    scaled = {n: r for n, r in runs.items() if r["scaler"]}
    for name, run in scaled.items():
        steps = range(len(run["scale"]))
        scale_ax.plot(steps, run["scale"], color=colours[name], marker="o", ms=3, label=name)
        skipped = [s for s in steps if run["skipped"][s]]
        scale_ax.plot(skipped, [run["scale"][s] for s in skipped], "x", color=BROKEN, ms=9, mew=2,
                      label="step skipped (inf in a gradient)")
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_title("GradScaler's loss scale")
    scale_ax.set_xlabel("training step")
    scale_ax.set_ylabel("scale (log2)")
    scale_ax.grid(alpha=0.3)
    scale_ax.legend(fontsize=8)
    return fig


def figures(results) -> dict:
    return {"precision_losses": draw_precisions(precision_runs(results))}
