"""ddp-lab: reproduce the errors of custom modules in PyTorch distributed training, on real ranks."""
from .launching.processes import prewarm
from .launching.launcher import launch
from .launching.rankinfo import RankInfo, ddp_kwargs, device, rank_info
from .course import exercise  # noqa: F401  (ddp_lab.exercise.try_fix in notebooks)
from .course.source import show
from .doctor import doctor  # the function; the package stays importable as ddp_lab.doctor.*
from .launching.results import DistributedRunError, ErrorInfo, RankResult, RunResult

__version__ = "0.1.0"
__all__ = ["launch", "prewarm", "RunResult", "RankResult", "ErrorInfo", "DistributedRunError", "RankInfo",
           "rank_info", "device", "ddp_kwargs", "show", "doctor", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """`%load_ext ddp_lab` registers the `%%ddp` cell magic."""
    from .course.magic import register

    register(ipython)
