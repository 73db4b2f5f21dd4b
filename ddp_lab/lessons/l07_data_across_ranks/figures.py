"""Lesson 07's picture: which sample each rank trained on, and when. Runs in the notebook's process."""
from __future__ import annotations


def seen_matrix(seen_by_rank, n: int, batch_size: int):
    """Rows (epoch, rank), columns sample index; value = the step (batch) within the epoch at
    which that rank trained on that sample (NaN: not trained on by that rank in that epoch)."""
    import numpy as np

    world, epochs = len(seen_by_rank), len(seen_by_rank[0])
    grid = np.full((epochs * world, n), np.nan)
    for e in range(epochs):
        for r in range(world):
            for pos, i in enumerate(seen_by_rank[r][e]):
                grid[e * world + r, i] = pos // batch_size
    return grid


def draw_seen(ax, seen_by_rank, n: int, batch_size: int, title: str, vmax: float | None = None):
    """A heat map of `seen_matrix`, one row per (epoch, rank)."""
    grid = seen_matrix(seen_by_rank, n, batch_size)
    world, epochs = len(seen_by_rank), len(seen_by_rank[0])
    image = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0, vmax=vmax)
    ax.set_yticks(range(epochs * world), [f"epoch {e} · rank {r}" for e in range(epochs)
                                          for r in range(world)], fontsize=8)
    for e in range(1, epochs):
        ax.axhline(e * world - 0.5, color="white", lw=2)
    ax.set_xlabel("sample index in the dataset")
    ax.set_title(title, fontsize=10)
    return image


def figures(results) -> dict:
    from ...course.plots import BROKEN, FIXED, figure

    panels = [("no sampler", results["no_sampler"]["broken"], BROKEN),
              ("sampler, no set_epoch", results["no_set_epoch"]["broken"], BROKEN),
              ("sampler + set_epoch", results["no_set_epoch"]["fixed"], FIXED)]
    fig, axes = figure(3, title="Which sample each rank trained on, and when (blank: not on that rank)",
                       width=4.6, height=4.0)
    vmax = max(max(p[1].values[0]["steps"] // p[1].values[0]["epochs"] for p in panels) - 1, 1)
    for ax, (name, result, colour) in zip(axes, panels):
        value = result.values[0]
        image = draw_seen(ax, value["seen"], value["n"], value["batch_size"],
                          f"{name}\noverlap {value['overlap']:.0%}, repeated epochs "
                          f"{value['repeated']:.0%}", vmax=vmax)
        ax.title.set_color(colour)
    fig.colorbar(image, ax=axes, label="training step within the epoch", shrink=0.8)
    return {"samples_seen": fig}
