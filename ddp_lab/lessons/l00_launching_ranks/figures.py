"""Lesson 00's figure: the corrected source example's loss on every rank."""
from __future__ import annotations

from ...course.plots import figure, per_rank_lines


def figures(results) -> dict:
    fixed = results["source_example"]["fixed"]
    fig, (ax,) = figure(1, title="The source example, corrected: each rank's loss", width=6.5)
    per_rank_lines(ax, [v["losses"] for v in fixed.values], title="DDP on CPU/gloo, Adam lr=1e-2",
                   xlabel="training step", ylabel="loss (mean squared error)")
    return {"source_example_losses": fig}
