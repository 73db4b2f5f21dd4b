"""The picture of lesson 16: parameter bytes per rank against the world size, simulated in one
process (the fake process group) beside what 2 and 4 real ranks measured."""
from __future__ import annotations

from ...course.plots import BROKEN, FIXED, figure

KIB = 1024
PLANS = {"TinyLM": ("the blocks' Linear layers only", BROKEN),
         "TinyLMFixed": ("embedding and output projection too", FIXED)}


def draw_memory(simulated: dict, measured: dict):
    """`simulated`: the fixed simulated_world run's value (curves by plan, the 2-D plan's
    bytes); `measured`: {plan name: memory_per_rank values of rank 0} from real ranks."""
    fig, (ax,) = figure(1, title="Parameter bytes per rank, tensor parallel over N ranks",
                        width=7.5, height=4.4)
    for name, (label, colour) in PLANS.items():
        curve = simulated["curves"][name]
        sizes = sorted(curve)
        ax.plot(sizes, [curve[n] / KIB for n in sizes], color=colour, marker=".",
                label=f"simulated, 1 process: {label}")
        real = measured[name]["bytes"]
        sizes = sorted(real)
        ax.plot(sizes, [real[n]["params"] / KIB for n in sizes], "o", ms=11, mfc="none",
                mec=colour, mew=2, label=f"measured on {', '.join(map(str, sizes))} real ranks")
    whole = simulated["unsharded_param_bytes"] / KIB
    sizes = sorted(simulated["curves"]["TinyLM"])
    ax.plot(sizes, [whole / n for n in sizes], ":", color="grey", label="the whole model / N")
    dp, tp = simulated["mesh"]
    ax.plot([dp * tp], [simulated["bytes"]["params"] / KIB], "*", ms=14, color="#8e44ad",
            label=f"simulated 2-D plan: FSDP2 over {dp} x tensor parallel over {tp}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ticks = [2 ** k for k in range(4, 11)]
    ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("ranks N (world size)")
    ax.set_ylabel("parameter bytes on rank 0 (KiB)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7.5, loc="lower left")
    return fig


def figures(results) -> dict:
    simulated = results["simulated_world"]["fixed"].values[0]
    runs = results["memory_per_rank"]
    measured = {"TinyLM": runs["broken"].values[0], "TinyLMFixed": runs["fixed"].values[0]}
    return {"memory_per_rank": draw_memory(simulated, measured)}
