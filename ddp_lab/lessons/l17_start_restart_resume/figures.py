"""Lesson 17's pictures: the loss of the straight run beside the two resumes (scenario 5), and
what each attempt of the elastic restart ran (scenario 4)."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, RANK_COLOURS, broken_beside_fixed, figure
from .runs_resume import STEPS


def resume_figure(partial, full):
    """Loss per step: the straight run, the resume from a model-only checkpoint, the resume from
    a full one (both restarts at step STEPS // 2)."""
    fig, (ax,) = figure(1, width=7.5, height=4.0,
                        title="Loss per step: one straight run, and two runs restarted at step 10")
    straight = partial.ranks[0].value["straight"]
    half = STEPS // 2
    after = range(half, STEPS)
    ax.plot(range(STEPS), straight, color="0.55", lw=5, alpha=0.5, label="straight run (no restart)")
    ax.plot(after, partial.ranks[0].value["losses"], "o-", color=BROKEN, ms=4,
            label="resumed from the model only")
    ax.plot(after, full.ranks[0].value["losses"], "s", color=FIXED, ms=5, mfc="none",
            label="resumed from everything (equal, bit for bit)")
    ax.axvline(half - 0.5, color="black", ls=":", lw=1)
    ax.set_yscale("log")
    ax.text(half - 0.4, ax.get_ylim()[1] * 0.8, "restart", va="top", fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylabel("loss, mean over ranks (log scale)")
    ax.set_xticks(range(0, STEPS + 1, 2))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _draw_attempts(ax, result, which: str) -> None:
    """One row per attempt and rank: a box for each step it ran; a step that ran before (in an
    earlier attempt) is hatched; where rank 1 was killed, a cross."""
    v = result.ranks[0].value
    rows = [(a, r) for a in v["attempts"] for r in (0, 1)]
    for y, (a, r) in enumerate(rows):
        before = {s for b in range(a) for s in v["steps"][f"{b}/{r}"]}
        steps = v["steps"][f"{a}/{r}"]
        for s in steps:
            ax.barh(y, 0.85, left=s - 0.425, height=0.6, color=RANK_COLOURS[a],
                    hatch="///" if s in before else None, edgecolor="black", lw=0.4)
        if a == 0 and r == 1:
            ax.plot(max(steps) + 1, y, "x", color="black", ms=10, mew=2)
    ax.set_yticks(range(len(rows)), [f"attempt {a} · rank {r}" for a, r in rows])
    if not ax.yaxis_inverted():  # shared y axes are inverted once for all
        ax.invert_yaxis()
    ax.set_xlabel("step")
    ax.set_xticks(range(0, 8))
    how = "no resume" if which == "broken" else "resumed"
    n = v["repeated"]
    ax.set_title(f"{how}: {n} step{'' if n == 1 else 's'} run twice")
    ax.grid(axis="x", alpha=0.3)


def restart_figure(broken, fixed):
    """Broken beside fixed: the steps each attempt of the elastic restart ran."""
    return broken_beside_fixed(_draw_attempts, broken, fixed, sharey=True,
                               title="torchrun --max-restarts 1, rank 1 killed at step 5 (x): "
                                     "the steps each attempt ran (hatched: run before)")


def figures(results) -> dict:
    resume, restart = results["partial_resume"], results["elastic_restart"]
    return {"resume_losses": resume_figure(resume["broken"], resume["fixed"]),
            "elastic_restart": restart_figure(restart["broken"], restart["fixed"])}
