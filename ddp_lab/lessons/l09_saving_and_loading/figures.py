"""The picture of lesson 09: which weights each rank holds after each scenario's load."""
from __future__ import annotations


_COLUMNS = {"every_rank_writes": "who writes", "module_prefix": "module. prefix",
            "map_location": "map_location", "load_order": "load order"}


def _draw_holdings(ax, runs, which: str) -> None:
    """One cell per (scenario, rank): the checksum of the weights the rank holds after loading,
    green when it is rank 0's checkpoint, red when it is not, grey when the load failed."""
    from matplotlib.patches import Rectangle

    from ...course.plots import BROKEN, FIXED

    for col, result in enumerate(runs.values()):
        for r in result.ranks:
            if r.ok:
                text = f"{r.value['checksum']:.4f}\n{r.value['holds']}"
                if "writers" in r.value:
                    text += f"\n{r.value['overwritten']} of {len(r.value['writers'])} writes lost"
                colour = FIXED if r.value["is_checkpoint"] else BROKEN
            else:
                text, colour = f"{r.error.type if r.error else r.status}\n(no weights)", "#95a5a6"
            ax.add_patch(Rectangle((col - 0.46, r.rank - 0.46), 0.92, 0.92, color=colour, alpha=0.3))
            ax.text(col, r.rank, text, ha="center", va="center", fontsize=8)
    world = max((res.world_size for res in runs.values()), default=1)
    ax.set_xlim(-0.5, len(runs) - 0.5)
    ax.set_ylim(world - 0.5, -0.5)
    ax.set_xticks(range(len(runs)), [_COLUMNS.get(k, k) for k in runs], fontsize=8)
    ax.set_yticks(range(world), [f"rank {r}" for r in range(world)])
    ax.set_xlabel("scenario (checksum = sum of every value in the state_dict)")
    ax.set_ylabel("rank")
    ax.set_title("weights each rank holds after loading")


def figures(results) -> dict:
    """Per-rank checksums of the weights after each scenario's load, broken beside fixed."""
    from ...course.plots import broken_beside_fixed

    broken = {name: runs["broken"] for name, runs in results.items()}
    fixed = {name: runs["fixed"] for name, runs in results.items()}
    fig = broken_beside_fixed(_draw_holdings, broken, fixed, height=3.0, sharey=False,
                              title="Which weights each rank ends up with (green: rank 0's checkpoint)")
    return {"checkpoint_checksums": fig}
