"""The pictures of lesson 14: each bug's measured error, broken beside fixed, one panel each;
and the loss rank 0 logs beside the all-reduced loss, step by step."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure, rank_colour

# scenario: (panel title, y label, the value a run returned, as the panel shows it)
PANELS = {
    "same_seed": ("1. one seed on every rank", "steps with the same dropout\nmask on every rank (%)",
                  lambda v: 100 * v["identical"]),
    "random_choice": ("2. random choice DDP never sees", "max |output difference|\nbetween ranks",
                      lambda v: v["divergence"]),
    "worker_seeds": ("3. DataLoader workers", "crop offsets that repeat\nanother draw (%)",
                     lambda v: 100 * v["repeated"]),
    "padded_eval": ("4. evaluation with padding", "|accuracy - one process's|\n(percentage points)",
                    lambda v: 100 * v["error"]),
    "rank0_loss": ("5. loss logged from rank 0", "max |logged - global loss|\n/ global loss (%)",
                   lambda v: 100 * v["error"]),
    "per_rank_normaliser": ("6. loss normalised per rank", "relative gradient error\nvs one process (%)",
                            lambda v: 100 * v["error"]),
}
LABELS = {"same_seed": ("same seed", "seed + rank"),
          "random_choice": ("seeded by rank", "shared init seed"),
          "worker_seeds": ("dataset's generator", "worker_init_fn"),
          "padded_eval": ("mean of ranks", "gathered by index"),
          "rank0_loss": ("rank 0's loss", "all-reduced"),
          "per_rank_normaliser": ("own count", "global count")}


def bars(ax, names, values, colours, ylabel: str, title: str) -> None:
    ax.bar(names, values, color=colours)
    top = max(values) or 1.0
    for i, v in enumerate(values):
        label = "0" if v == 0 else f"{v:.3g}" if v >= 1e-3 else "≈ 0"
        ax.text(i, v + 0.02 * top, label, ha="center", fontsize=8)
    ax.set_ylim(0, 1.15 * top)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)


def padded_eval_bars(ax, value) -> None:
    """All four ways to evaluate under the padding sampler, against one process."""
    acc = value["accuracy"]
    names = ["mean of\nranks", "gathered\nby index", "sums and\ncounts", "drop_last"]
    errors = [100 * abs(acc[m] - acc["one_process"])
              for m in ("mean_of_ranks", "gather", "sum_count", "drop_last")]
    title, ylabel, _ = PANELS["padded_eval"]
    bars(ax, names, errors, [BROKEN, FIXED, FIXED, "#7f7f7f"], ylabel, title)


def errors_figure(results):
    fig, axes = figure(3, 2, title="Six silent bugs: the error each one makes, broken beside fixed",
                       width=4.2, height=3.2)
    for ax, (name, (title, ylabel, read)) in zip(axes, PANELS.items()):
        if name == "padded_eval":
            padded_eval_bars(ax, results[name]["broken"].values[0])
            continue
        values = [read(results[name][w].values[0]) for w in ("broken", "fixed")]
        bars(ax, list(LABELS[name]), values, [BROKEN, FIXED], ylabel, title)
    return fig


def loss_figure(result):
    """Rank 0's loss, the all-reduced loss and one process's loss on the global batch."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax,) = figure(1, title="What gets logged: rank 0's loss vs the loss over all ranks",
                        width=7.0, height=3.6)
    v = result.values[0]
    ax.plot(v["local"], marker="o", ms=4, color=BROKEN, label="logged on rank 0 only")
    ax.plot(v["all_reduced"], marker="s", ms=4, color=FIXED, label="all-reduced over ranks")
    ax.plot(v["global"], "k--", lw=1, label="one process, global batch")
    for rank, r in enumerate(result.values[1:], start=1):
        ax.plot(r["local"], ls=":", color=rank_colour(rank), label=f"rank {rank}'s own loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("MSE loss")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def figures(results) -> dict:
    return {"errors_broken_vs_fixed": errors_figure(results),
            "logged_loss": loss_figure(results["rank0_loss"]["broken"])}
