"""Lesson 20's pictures: the epoch loss at world size 1, 2 and 4, broken beside fixed; and where in
the epoch's order a resumed job trains twice or never."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, rank_colour

# world 1 dashed black; 2 and 4 with markers of their own, so that curves lying on it still show
WORLD_STYLE = {"1": ("k", "--", "o", 3), "2": (rank_colour(0), "-", "s", 6), "4": (rank_colour(1), "-", "x", 7)}


def draw_worlds(ax, value: dict, title: str) -> None:
    """The epoch loss after each optimizer step, against the samples processed so far, at each
    world size of one `same_job_at` run."""
    for world, curve in value["curves"].items():
        batch = value["global_batch"][world]
        colour, style, marker, size = WORLD_STYLE.get(world, ("grey", ":", ".", 3))
        ax.plot([batch * (i + 1) for i in range(len(curve))], curve, style, color=colour, marker=marker,
                ms=size, mfc="none", label=f"world {world} (global batch {batch})")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("samples processed in the epoch")
    ax.set_ylabel("epoch loss (MSE over all 256 samples)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def draw_resume(ax, value: dict, title: str) -> None:
    """How many times each sample was trained on in the epoch, in the epoch's order."""
    times = value["times_in_order"]
    ax.bar(range(len(times)), times, width=1.0, color=[
        BROKEN if n != 1 else "#999999" for n in times])
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("position in the epoch's shuffled order")
    ax.set_ylabel("times trained on")
    ax.set_yticks([0, 1, 2])


def figures(results) -> dict:
    out = {}
    if "per_rank_batch" in results:
        runs = results["per_rank_batch"]
        panels = [("per-rank batch 16 at every world size", runs["broken"], BROKEN),
                  ("global batch 16 (per-rank 16 / world)", runs["fixed"], FIXED)]
        if "linear_lr" in results:  # not a declared variant: the linear rule, for comparison
            panels.append(("per-rank batch 16, lr x world", results["linear_lr"], "#7f6000"))
        fig, axes = figure(len(panels), title="The same job at world size 1, 2 and 4: "
                                              "epoch loss after each step", sharey=True)
        for ax, (title, result, colour) in zip(axes, panels):
            draw_worlds(ax, result.values[0], title)
            ax.title.set_color(colour)
        out["loss_at_world_sizes"] = fig
    if "resume_elsewhere" in results:
        runs = results["resume_elsewhere"]
        fig, axes = figure(2, title="Checkpointed at 4 ranks after 6 steps, resumed at 2: "
                                    "each sample of the epoch", sharey=True)
        for ax, which, title, colour in zip(axes, ("broken", "fixed"),
                                            ("skip the saved steps per rank", "shard what is left"),
                                            (BROKEN, FIXED)):
            draw_resume(ax, runs[which].values[0], title)
            ax.title.set_color(colour)
        out["resume_order"] = fig
    return out
