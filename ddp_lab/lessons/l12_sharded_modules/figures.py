"""The picture of lesson 12: the bytes each rank holds, by ZeRO stage, measured beside the
ZeRO paper's formula."""
from __future__ import annotations

from matplotlib.patches import Patch

from ...course.plots import figure

PARTS = {"params": "parameters", "grads": "gradients",
         "optim": "Adam state (+ DeepSpeed's float32 master copy)",
         "buckets": "DDP's gradient buckets (not in the formula)"}
COLOURS = {"params": "#2980b9", "grads": "#e67e22", "optim": "#27ae60", "buckets": "#95a5a6"}
LABELS = {"ddp": "DDP\n(stage 0)", "zero1": "ZeRO-1 (torch)\n(stage 1)",
          "fsdp2": "FSDP2\n(stage 3)", "ds1": "DeepSpeed\nstage 1", "ds2": "DeepSpeed\nstage 2",
          "ds3": "DeepSpeed\nstage 3"}


def draw_memory(value: list[dict], world_size: int = 2):
    """Stacked bars: measured bytes on each rank per strategy, and the formula's bar."""
    from .runs_memory import STAGES, formula_bytes

    fig, (ax,) = figure(1, title=f"What each rank holds after two Adam steps ({world_size} "
                                 "ranks, float32)", width=13, height=4.6)
    psi, names = value[0]["psi"], list(value[0]["bytes"])
    x, ticks, labels, top = 0.0, [], [], 0.0
    for name in names:
        group = [(f"rank {r}", v["bytes"][name]) for r, v in enumerate(value)]
        group.append(("formula", formula_bytes(STAGES[name], psi, world_size)))
        start = x
        for label, parts in group:
            bottom = 0.0
            for part, colour in COLOURS.items():
                kib = parts.get(part, 0) / 1024
                ax.bar(x, kib, bottom=bottom, color=colour, width=0.8, edgecolor="white",
                       hatch="//" if label == "formula" else None)
                bottom += kib
            top = max(top, bottom)
            ticks.append(x)
            labels.append(label)
            x += 1
        ax.text((start + x - 1) / 2, 1.0, LABELS[name], transform=ax.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=9)
        x += 0.7
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylim(0, top * 1.3)
    ax.set_ylabel("bytes held on the rank (KiB)")
    ax.set_xlabel("measured on each rank (solid) beside the ZeRO formula (hatched)")
    handles = [Patch(color=c, label=PARTS[p]) for p, c in COLOURS.items()]
    ax.legend(handles=handles, fontsize=8, loc="upper center", ncol=4)
    ax.grid(axis="y", alpha=0.3)
    return fig


def figures(results) -> dict:
    run = results["memory_per_rank"]["fixed"]
    return {"memory_per_rank": draw_memory(run.values, run.world_size)}
