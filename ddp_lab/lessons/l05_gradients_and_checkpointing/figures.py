"""The picture of lesson 05: activation memory with and without checkpointing against depth,
each rank's peak memory, and the memory a retain_graph loop piles up step by step."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, rank_colour


def draw_depth(ax, broken: dict, fixed: dict) -> None:
    """MiB saved for backward against depth: `broken` / `fixed` are rank 0's values."""
    for value, colour, label in ((broken, BROKEN, "no checkpointing"),
                                 (fixed, FIXED, "each block checkpointed")):
        depths = sorted(value["saved_by_depth"])
        ax.plot(depths, [value["saved_by_depth"][d] for d in depths], marker="o", color=colour,
                label=label)
    ax.set_title("saved for backward (saved-tensor hooks)")
    ax.set_xlabel("depth (MLP blocks)")
    ax.set_ylabel("MiB held for backward (batch 2048)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def draw_peaks(ax, broken_values: list, fixed_values: list) -> None:
    """Each rank's growth of peak resident memory during one step, broken beside fixed."""
    width = 0.38
    for rank, (b, f) in enumerate(zip(broken_values, fixed_values)):
        ax.bar(rank - width / 2, b["peak_growth_mb"], width, color=BROKEN, edgecolor=rank_colour(rank),
               label="no checkpointing" if rank == 0 else None)
        ax.bar(rank + width / 2, f["peak_growth_mb"], width, color=FIXED, edgecolor=rank_colour(rank),
               label="each block checkpointed" if rank == 0 else None)
    ax.set_xticks(range(len(broken_values)), [f"rank {r}" for r in range(len(broken_values))])
    ax.set_ylim(0, 1.35 * max(v["peak_growth_mb"] for v in broken_values + fixed_values))
    ax.set_title("peak memory of one training step (depth 8)")
    ax.set_ylabel("growth of peak resident memory (MiB)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def draw_retain(ax, retained: dict, detached: dict) -> None:
    """MiB autograd holds after each step, and the growth of the rank's memory, for both loops."""
    for value, colour, label in ((retained, BROKEN, "retain_graph=True"),
                                 (detached, FIXED, "state detached")):
        steps = range(1, len(value["held_mb"]) + 1)
        ax.plot(steps, value["held_mb"], marker="o", ms=3, color=colour, label=f"{label}: held by autograd")
        grown = [mb - value["memory_mb"][0] for mb in value["memory_mb"]]
        ax.plot(steps, grown, ls="--", color=colour, label=f"{label}: rank memory growth")
    ax.set_title("carried state: memory after each step")
    ax.set_xlabel("training step")
    ax.set_ylabel("MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def draw_memory(activation: dict, retain: dict):
    """`activation` / `retain`: {"broken": RunResult, "fixed": RunResult} of the two scenarios."""
    fig, (depth_ax, peak_ax, retain_ax) = figure(3, title="Memory for backward: checkpointing "
                                                 "and retain_graph (DDP, 2 ranks)")
    draw_depth(depth_ax, activation["broken"].ranks[0].value, activation["fixed"].ranks[0].value)
    draw_peaks(peak_ax, activation["broken"].values, activation["fixed"].values)
    draw_retain(retain_ax, retain["broken"].ranks[0].value, retain["fixed"].ranks[0].value)
    return fig


def figures(results) -> dict:
    return {"backward_memory": draw_memory(results["activation_memory"], results["retain_graph"])}
