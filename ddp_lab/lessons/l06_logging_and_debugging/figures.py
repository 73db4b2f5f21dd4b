"""Reading runs, in the launcher's process: what the console showed, what a debug level revealed,
what torchrun's summary says, and the straggler picture. Nothing here runs a rank."""
from __future__ import annotations

import re

from ...instruments.logs import console, records
from ...launching.results import peer_gone

_NAMES = re.compile(r"Parameters which did not receive grad for rank \d+: (.+)")
_CPP_NAME = re.compile(r"Parameter: (\S+) did not get gradient")
_CPP_LOG = re.compile(r"^(\[rank\d+\]:)?\[[IWE]\d{4} ")  # a C++ (glog-style) log line
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)")


def console_summary(result, marker: str = "training done") -> dict:
    """Lines of the run's messages on the shared console, and how many say which rank wrote them."""
    lines = [ln for ln in console(result).splitlines() if "step " in ln or marker in ln]
    return {"lines": len(lines), "distinct": len(set(lines)),
            "say_which_rank": sum("[rank " in ln for ln in lines),
            "records": [len(records(r, logger="train", level="INFO")) for r in result.ranks]}


def debug_summary(result, params=("aux_head.weight", "aux_head.bias")) -> dict:
    """What one debug level showed on rank 0: how the run ended, its stderr, the unused
    parameters it named (by name, or only by index), and how many lines name one of `params`."""
    r0 = result.ranks[0]
    text = (r0.error.message if r0.error else "") + "\n" + r0.stderr
    names = set()
    for m in _NAMES.finditer(text):
        names.update(n.strip() for n in m.group(1).split(","))
    names.update(_CPP_NAME.findall(text))
    indices = sorted({i for m in _INDICES.finditer(text) for i in m.group(1).split()})
    lines = r0.stderr.splitlines()
    return {"status": result.status, "signal": r0.signal, "stderr_lines": len(lines),
            "names": sorted(names), "indices": indices,
            "lines_naming": sum(any(p in ln for p in params) for ln in lines),
            "cpp_log_lines": sum(bool(_CPP_LOG.match(ln)) for ln in lines)}


def ddp_settings(result, keys=("find_unused_parameters", "torch_distributed_debug")) -> dict:
    """Settings from the "DDP Initialized with:" block that TORCH_CPP_LOG_LEVEL=INFO prints."""
    found = {}
    for line in result.ranks[0].stderr.splitlines():
        key, _, value = line.partition(": ")
        if key in keys:
            found[key] = value.strip()
    return found


def torchrun_failures(message: str) -> dict:
    """torchrun's ChildFailedError summary, parsed: `failures` {rank: {"exitcode", "error"}}
    and `root_cause` (the rank it names first)."""
    other, _, root = message.partition("Root Cause (first observed failure):")
    failures, root_rank = {}, None
    for part, is_root in ((other, False), (root, True)):
        for block in re.split(r"\n\[\d+\]:\n", part)[1:]:
            rank = int(re.search(r"rank\s*:\s*(\d+)", block).group(1))
            code = int(re.search(r"exitcode\s*:\s*(-?\d+)", block).group(1))
            lines = [ln.strip() for ln in block.splitlines() if ln.strip() and not set(ln.strip()) <= set("=-")]
            failures[rank] = {"exitcode": code, "error": lines[-1] if lines else ""}
            if is_root:
                root_rank = rank
    return {"failures": dict(sorted(failures.items())), "root_cause": root_rank}


def is_collateral(failure: dict) -> bool:
    """A worker that failed because a peer did: a peer-gone error, or stopped by torchrun (SIGTERM)."""
    return failure["exitcode"] == -15 or peer_gone(failure["error"])


# -- the straggler picture ----------------------------------------------------------------------

COLOURS = {"data": "#937860", "forward + backward": "#4c72b0", "optimizer step": "#8172b2",
           "all_reduce (DDP)": "#c44e52"}


def _draw_straggler(ax, result, which):
    from ...course.plots import gantt

    spans = [sorted(v["spans"], key=lambda s: s[0] == "all_reduce (DDP)") for v in result.values]
    gantt(ax, spans, colours=COLOURS, title=f"rank 0: {result.values[0]['wait_s'] * 1000:.0f} ms "
          "per step in all_reduce", xlabel="time since the ranks aligned (s)")
    legend = ax.get_legend()
    ax.legend(legend.legend_handles, [t.get_text() for t in legend.get_texts()],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8)


def straggler_figure(broken, fixed):
    """Broken (rank 1 loads each batch slowly) beside fixed: per-rank timelines, with DDP's
    all-reduce (from the moment a rank's gradients are ready to the moment every rank's have
    arrived) drawn on top of the backward pass it overlaps."""
    from ...course.plots import broken_beside_fixed

    return broken_beside_fixed(_draw_straggler, broken, fixed, sharey=False,
                               title="A straggler: rank 1's slow data makes rank 0 wait in DDP's all-reduce")


def step_times(result) -> list[list[float]]:
    """Per rank, each step's duration (s): from one step's data span to the next."""
    out = []
    for v in result.values:
        starts = [s for n, s, _ in v["spans"] if n == "data"]
        ends = [e for n, _, e in v["spans"] if n == "optimizer step"]
        out.append([e - s for s, e in zip(starts, ends)])
    return out
