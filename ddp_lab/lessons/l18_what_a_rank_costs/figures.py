"""Lesson 18's pictures, all drawn from what the launcher brought back (`RankResult.steps`,
`RankResult.collectives`, the ranks' values): memory per rank over steps, broken beside fixed;
step time against threads per rank; collectives per step."""
from __future__ import annotations

from statistics import median

from ...course.plots import BROKEN, FIXED, figure, rank_colour, show_figures_in_ipython

MEMORY_ROWS = {
    "graph_history": ("1. a loss history", "resident memory (MiB)",
                      lambda s: s.rss_mb),
    "rank0_gather": ("2. a metric", "highest resident memory\ninside the step (MiB)",
                     lambda s: s.peak_mb),
}
VARIANT_TITLES = {
    "graph_history": ("history.append(loss)", "history.append(loss.item())"),
    "rank0_gather": ("gathered to rank 0", "reduced to a sum and a count"),
    "worker_copies": ("rows as Python objects", "rows in one NumPy array"),
}


def _rank_lines(ax, result, read) -> None:
    for r in result.ranks:
        ys = [read(s) for s in r.steps or []]
        ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, color=rank_colour(r.rank),
                label=f"rank {r.rank}")


def _worker_lines(ax, result) -> None:
    for r in result.ranks:
        series: dict[int, list] = {}
        for i, s in enumerate(r.steps or [], start=1):
            for c in s.children:
                series.setdefault(c.pid, []).append((i, c.private_mb))
        for w, points in enumerate(series.values()):
            ax.plot(*zip(*points), color=rank_colour(r.rank), ls=("-", "--", ":", "-.")[w % 4],
                    label=f"rank {r.rank}, worker {w}")


def memory_figure(results):
    """Rows: scenarios 1-3; columns: broken, fixed (sharing the y axis)."""
    from matplotlib.ticker import MaxNLocator  # here, not at import: ranks import this package
    names = [n for n in ("graph_history", "rank0_gather", "worker_copies") if n in results]
    fig, axes = figure(2, len(names), width=5.0, height=3.0,
                       title="Memory per rank, step by step (ddp_lab.measured_step)")
    for row, name in enumerate(names):
        left, right = axes[2 * row], axes[2 * row + 1]
        right.sharey(left)
        for ax, which, colour in ((left, "broken", BROKEN), (right, "fixed", FIXED)):
            run = results[name][which]
            if name == "worker_copies":
                _worker_lines(ax, run)
                ax.set_ylabel("private memory of each\nDataLoader worker (MiB)")
                title = "3. DataLoader workers"
            else:
                title, ylabel, read = MEMORY_ROWS[name]
                _rank_lines(ax, run, read)
                ax.set_ylabel(ylabel)
            ax.set_title(f"{title}, {which}: {VARIANT_TITLES[name][which == 'fixed']}\n"
                         f"(world size {run.world_size})", fontsize=9, color=colour)
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
    return fig


def threads_figure(results):
    """Seconds per step at each thread count over seconds per step at the fair share, measured
    in one run per world size; every run given (any key) adds its world size."""
    fig, (ax,) = figure(1, width=6.0, height=3.8,
                        title="Threads per rank: step time, measured in one run per world size")
    by_size = {}
    for run in results["oversubscribed_threads"].values():
        by_size.setdefault(run.world_size, run)
    ticks = set()
    for i, (size, run) in enumerate(sorted(by_size.items())):
        v = run.values[0]
        counts = sorted(v["seconds_per_step"])
        ticks.update(counts)
        per_rank = [r.value["seconds_per_step"] for r in run.ranks]
        ratios = [median(t[k] / t[v["fair_share"]] for t in per_rank) for k in counts]
        ax.plot(counts, ratios, marker="o", color=rank_colour(i + 2),
                label=f"{size} ranks on {v['cores']} cores")
        for k, y in zip(counts, ratios):
            ax.annotate(f"{y:.1f}x", (k, y), textcoords="offset points", xytext=(6, -3), fontsize=8)
    ax.axhline(1, color=FIXED, lw=1, ls="--")
    ax.set_xticks(sorted(ticks))
    ax.set_xlabel("threads per rank")
    ax.set_ylabel("seconds per step / seconds per step\nat the fair share (cores // ranks)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


TEXT = 9  # points: the figure is drawn at the width a notebook shows it, so this is what one reads


def _steps_bars(ax, results, name: str, op: str | None, labels) -> None:
    """Collectives (of `op`) per step on rank 0, broken beside fixed. Counts only: the step
    times of two runs on a shared machine are not a measurement worth a ratio (the ratio in
    panel 5's title comes from one run that times both loops, UNASKED_TIMING)."""
    from matplotlib.ticker import MaxNLocator

    width = 0.4
    steps = 0
    for i, (which, colour) in enumerate((("broken", BROKEN), ("fixed", FIXED))):
        counts = [c or 0 for c in results[name][which].ranks[0].collectives_per_step(op)]
        steps = max(steps, len(counts))
        bars = ax.bar([s + 1 + (i - 0.5) * width for s in range(len(counts))], counts, width,
                      color=colour, label=labels[i])
        ax.bar_label(bars, fontsize=TEXT)
    ax.set_xticks(range(1, steps + 1))
    ax.set_xlabel("step (rank 0)")
    ax.set_ylabel(f"{op or 'collectives'} per step\n(flight recorder)")
    if ax.get_yscale() == "log":
        ax.set_ylim(0.5, ax.get_ylim()[1] * 8)
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, ax.get_ylim()[1] * 1.5)
    ax.legend(fontsize=TEXT, loc="upper center", ncol=2)
    ax.grid(axis="y", alpha=0.3)


def _held_bars(held, values) -> None:
    """What the rank holds after training with the gradients beside the buckets, and as views
    into them, against multiples of the parameters' size."""
    from matplotlib.transforms import blended_transform_factory

    param_mb = values["broken"]["param_bytes"] / 2 ** 20
    held.bar(["gradients beside\nthe buckets", "gradient_as_\nbucket_view=True"],
             [values[w]["held_mb"] for w in ("broken", "fixed")], width=0.6,
             color=[BROKEN, FIXED])
    held.set_xlim(-0.5, 1.5)
    right = blended_transform_factory(held.transAxes, held.transData)
    for k in (1, 2, 3):
        held.axhline(k * param_mb, color="grey", lw=0.8, ls=":")
        held.text(1.01, k * param_mb, f"{k}x the\nparameters", transform=right, fontsize=TEXT,
                  va="center", ha="left", color="dimgrey")
    held.set_ylabel("memory held after training,\nabove the rank before the model (MiB)")
    held.set_title("6. memory the gradients take (rank 0)", fontsize=10)
    held.grid(axis="y", alpha=0.3)


def collectives_figure(results):
    """Panel 5 across the top (8 steps), panel 6's two views below it: drawn at the width a
    notebook column shows (about 830 px), so that no label shrinks below TEXT points."""
    from matplotlib.figure import Figure

    show_figures_in_ipython()
    fig = Figure(figsize=(8.2, 7.2), layout="constrained")
    axes = fig.subplot_mosaic([["five", "five"], ["six", "held"]],
                              gridspec_kw={"width_ratios": [1.15, 1]})
    five, six, held = axes["five"], axes["six"], axes["held"]
    fig.suptitle("Collectives per step, and what the buckets hold", fontsize=12,
                 fontweight="bold")
    _steps_bars(five, results, "unasked_collectives", None,
                ("log every step, find_unused_parameters=True", "log every 4 steps"))
    five.set_title("5. collectives nobody asked for", fontsize=10)
    timed = results["unasked_collectives"].get("timed")  # UNASKED_TIMING's run, where given
    if timed is not None and timed.ok:
        five.set_title("5. collectives nobody asked for; step time, broken / fixed: "
                       + ", ".join(f"rank {r.rank} ×{r.value['ratio']:.2f}" for r in timed.ranks)
                       + "\n(both loops timed in one run, in alternating blocks)", fontsize=10)
    six.set_yscale("log")
    cap = results["small_buckets"]["broken"].values[0]["bucket_bytes"][0] / 2 ** 20
    _steps_bars(six, results, "small_buckets", "all_reduce",
                (f"bucket_cap_mb={cap:g}", "default"))
    six.set_title("6. DDP buckets: all-reduces per step", fontsize=10)
    _held_bars(held, {w: results["small_buckets"][w].values[0] for w in ("broken", "fixed")})
    for ax in (five, six, held):
        ax.tick_params(labelsize=TEXT)
    return fig


def figures(results) -> dict:
    out = {}
    if all(n in results for n in ("graph_history", "rank0_gather", "worker_copies")):
        out["memory_per_step"] = memory_figure(results)
    if "oversubscribed_threads" in results:
        out["threads"] = threads_figure(results)
    if all(n in results for n in ("unasked_collectives", "small_buckets")):
        out["collectives_per_step"] = collectives_figure(results)
    return out
