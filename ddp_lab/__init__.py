"""ddp-lab: reproduce the errors of custom modules in PyTorch distributed training, on real ranks."""
from ._procs import prewarm
from .launcher import launch
from .rankinfo import RankInfo, ddp_kwargs, device, rank_info
from . import exercise  # noqa: F401  (ddp_lab.exercise.check in notebooks)
from .display import show
from .doctor import doctor  # the function; the package stays importable as ddp_lab.doctor.*
from .results import DistributedRunError, ErrorInfo, RankResult, RunResult

__version__ = "0.1.0"
__all__ = ["launch", "prewarm", "RunResult", "RankResult", "ErrorInfo", "DistributedRunError", "RankInfo",
           "rank_info", "device", "ddp_kwargs", "show", "doctor", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """`%load_ext ddp_lab` registers the `%%ddp` cell magic."""
    from .magic import register

    register(ipython)
