"""The pictures of lesson 08: each buffer's value per rank over the training steps."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, rank_colour


def _mean(values) -> float:
    return sum(values) / len(values)


def draw_buffer(ax, result, title: str) -> None:
    """Every rank's running mean (averaged over the features) after each step, and the running
    mean of all the data that one process would keep (dashed)."""
    for rank, value in enumerate(result.values):
        ax.plot([_mean(h) for h in value["history"]], marker="o", ms=3, color=rank_colour(rank),
                label=f"rank {rank}")
    ref = result.values[0]["reference"]
    ax.plot([_mean(h) for h in ref], "k--", lw=1.2, label="all data (one process)")
    ax.set_title(title, fontsize=10)
    _finish(ax, "running_mean, mean over features")


def draw_norm(ax, result, title: str) -> None:
    """BatchNorm's running_mean[0] per rank, beside the single-process reference."""
    for rank, value in enumerate(result.values):
        ax.plot([h[0] for h in value["history"]], marker="o", ms=3, color=rank_colour(rank),
                label=f"rank {rank}")
    ax.plot([h[1] for h in result.values[0]["history"]], "k--", lw=1.2,
            label="one process, global batch")
    ax.set_title(title, fontsize=10)
    _finish(ax, "norm.running_mean[0] (activation units)")


def _finish(ax, ylabel: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def figures(results) -> dict:
    panels = [("local buffer, no forward sync", results["local_buffer"]["broken"], BROKEN),
              ("local buffer, DDP syncs from rank 0", results["rank0_buffer"]["broken"], BROKEN),
              ("buffer updated from all ranks", results["local_buffer"]["fixed"], FIXED)]
    fig, axes = figure(3, title="A buffer updated from local data: its value on each rank",
                       width=4.4, sharey=True)
    for ax, (title, result, colour) in zip(axes, panels):
        draw_buffer(ax, result, title)
        ax.title.set_color(colour)
    norm_fig, (left, right) = figure(2, title="BatchNorm with 4 samples per rank: running mean "
                                              "per rank vs one process on the global batch", sharey=True)
    draw_norm(left, results["batchnorm_small_batches"]["broken"], "nn.BatchNorm1d")
    draw_norm(right, results["batchnorm_small_batches"]["fixed"], "SyncedNorm1d (all-reduced statistics)")
    left.title.set_color(BROKEN)
    right.title.set_color(FIXED)
    return {"buffers_per_rank": fig, "batchnorm_running_mean": norm_fig}
