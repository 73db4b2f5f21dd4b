"""ddp-lab: reproduce the errors of custom modules in PyTorch distributed training, on real ranks.

The public face: what notebooks, scripts and the README use, from `ddp_lab` itself.

    launch, prewarm, RunResult, RankResult, ErrorInfo, DistributedRunError, LaunchInterrupted
    rank_info, device, ddp_kwargs, restart_clock, RankInfo     (inside a rank)
    sanitize, divergence (where the ranks stop agreeing: .table, .describe)
    get_lesson, get_scenario, show, try_fix, scenario_panel, plots
    get_logger, logs (the rank-aware logger and its records)
    measured_step (inside a rank: what each step costs, RankResult.steps)
    doctor; watch (your own training step, checked across ranks after each step)
    %load_ext ddp_lab for the %%ddp cell magic

The parts behind it: launching/ (the engine and the record of a run), instruments/ (what lessons
and the doctor measure with), course/ (registry, tour, exercises, widgets, magic, plots), kit/
(workshop, site, pre-flight), lessons/ and doctor/. Names that would import more than the
engine and the registry (widgets, plots, the logger) load on first use.
"""
from .course.exercise import try_fix
from .course.registry import get_lesson, get_scenario
from .course.source import show
from . import doctor  # the package, callable as its function doctor(): see doctor/__init__.py
from .launching import (DistributedRunError, ErrorInfo, LaunchInterrupted, RankInfo, RankResult,
                        RunResult, ddp_kwargs, device, launch, prewarm, rank_info, restart_clock,
                        sanitize)

__version__ = "0.1.0"
_LAZY = ("scenario_panel", "plots", "logs", "get_logger", "divergence", "measured_step", "watch")  # imported on first use
__all__ = ["launch", "prewarm", "RunResult", "RankResult", "ErrorInfo", "DistributedRunError",
           "LaunchInterrupted", "RankInfo", "rank_info", "device", "ddp_kwargs", "restart_clock",
           "sanitize", "get_lesson", "get_scenario", "show", "try_fix", "doctor",
           "load_ipython_extension", *_LAZY]


def __getattr__(name: str):
    """The names of _LAZY, imported when first asked for (ipywidgets, matplotlib and logging
    stay out of `import ddp_lab`)."""
    if name == "scenario_panel":
        from .course.widgets import scenario_panel as value
    elif name == "plots":
        from .course import plots as value
    elif name == "logs":
        from .instruments import logs as value
    elif name == "get_logger":
        from .instruments.logs import get_logger as value
    elif name == "divergence":
        from .launching import divergence as value
    elif name == "watch":
        from .doctor.watch import watch as value
    elif name == "measured_step":
        from .instruments.probes import measured_step as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """`%load_ext ddp_lab` registers the `%%ddp` cell magic."""
    from .course.magic import register

    register(ipython)
