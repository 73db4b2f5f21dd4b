"""Lesson 03's figure: the timelines that survive a hang. Each span a rank's `LoggedTimeline`
(runs.py) wrote to its log is read back from its record, the span it was stuck in ending when the
rank was stopped, and drawn as a Gantt chart per rank."""
from __future__ import annotations

from ...instruments.logs import records
from .runs import LOGGER

COLOURS = {"forward": "#4c72b0", "backward": "#55a868", "optimizer step": "#8172b2",
           "all_reduce": "#c44e52", "barrier": "#dd8452"}


def spans_from_run(result) -> tuple[list[list[tuple]], list[list[tuple]]]:
    """Every rank's spans read back from its record: (finished spans, spans still open when the
    rank was stopped, ended at the moment it was stopped), each a list per rank."""
    done, still_open = [], []
    for rank in result.ranks:
        t0, started, finished = None, {}, []
        for rec in records(rank, logger=LOGGER):
            words = rec.message.split(" ")
            if words[:2] == ["timeline", "t0"]:
                t0 = float(words[2])
            elif words[:2] == ["span", "start"]:
                started[" ".join(words[2:-1])] = float(words[-1])
            elif words[:2] == ["span", "end"]:
                name = " ".join(words[2:-2])
                started.pop(name, None)
                finished.append((name, float(words[-2]), float(words[-1])))
        stopped = (rank.failed_at - t0) if (rank.failed_at and t0 is not None) else None
        done.append(finished)
        still_open.append([(n, s, stopped) for n, s in started.items() if stopped is not None])
    return done, still_open


def draw_timeline(ax, result, which: str) -> None:
    """One panel: each rank's spans; a span still open when the rank was stopped is hatched."""
    from ...course.plots import gantt

    done, still_open = spans_from_run(result)
    gantt(ax, [d + o for d, o in zip(done, still_open)], colours=COLOURS,
          title=f"{result.status}", xlabel="time since the ranks aligned (s)")
    legend = ax.get_legend()
    if legend is not None:  # below the axes, out of the way of the bars
        ax.legend(legend.legend_handles, [t.get_text() for t in legend.get_texts()],
                  loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=5, fontsize=8)
    for rank, spans in enumerate(still_open):
        for name, start, end in spans:
            ax.barh(rank, end - start, left=start, height=0.6, fill=False, hatch="//",
                    edgecolor="white", linewidth=0)
            ax.text((start + end) / 2, rank, f"rank {rank} still in {name} when stopped",
                    ha="center", va="center", fontsize=9, color="white", fontweight="bold",
                    bbox={"facecolor": "black", "alpha": 0.55, "edgecolor": "none"})


def timeline_figure(broken, fixed):
    """Broken beside fixed: per-rank Gantt charts of training phases and collectives."""
    from ...course.plots import broken_beside_fixed

    return broken_beside_fixed(draw_timeline, broken, fixed, sharey=False,
                               title="Collectives per rank: loss all-reduced on rank 0 only, "
                                     "then on every rank")


def figures(results) -> dict:
    run = results["collective_on_rank0"]
    return {"collective_timeline": timeline_figure(run["broken"], run["fixed"])}
