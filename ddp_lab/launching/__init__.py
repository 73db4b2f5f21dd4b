"""The engine and the record of a run: `launch` starts real ranks (one fresh process each, forked
from a clean fork server or spawned), watches them, stops a hung one with every thread's stack,
and brings back a `RunResult`; the flight recorder, py-spy, torchrun's own ranks, where the ranks
stop agreeing, sanitizing and displaying results live here too.

    launcher.py    launch(): start, watch, time out and reap the ranks; the only starter of processes
    processes.py   the handles of rank processes (forked from the fork server, or spawned); /proc
    forkserver.py  the clean fork server (started by exec, preloads torch, forks one child per rank)
    child.py       what runs inside a rank process: spec, output capture, stacks, the group, result
    rankinfo.py    RANK / LOCAL_RANK / WORLD_SIZE read in one place: rank_info, device, ddp_kwargs;
                   scratch_dir (the launch's own folder, removed when it ends)
    torchrun.py    under torchrun: run the function on this rank, end the rank without teardown
    pyspy.py       optional native stacks of a hung rank
    flight.py      PyTorch's flight recorder: arm it in the rank, dump, read and parse the record
    divergence.py  where the ranks stop agreeing: the first collective they entered differently,
                   a rank that returned while its peers were in a collective
    results.py     RankResult, RunResult: plain records of a launch, their deterministic text
    display.py     how a RunResult looks in a notebook (the HTML table), what the stop button shows
    sanitize.py    remove what varies between runs (addresses, ports, PIDs, times, machine paths)
    frames.py      which stack frames, files and module names are ddp_lab's own
    cuda_init.py   a GPU count that never initialises CUDA, and the fork server's poison check
    costs.py       what a rank costs per step: memory and collectives (`measured_step` records)

May import: nothing else of ddp_lab (every other part stands on this one). Lessons use the names
below (and the public modules: rankinfo, results, divergence, flight, sanitize, display); the
engine's modules (processes, forkserver, child, frames) are its own.
"""
from .child import die_with_parent
from .launcher import launch
from .processes import prewarm
from .rankinfo import (RankInfo, ddp_kwargs, device, in_torchrun, rank_info, restart_clock,
                       scratch_dir)
from .results import DistributedRunError, ErrorInfo, LaunchInterrupted, RankResult, RunResult
from .sanitize import sanitize

__all__ = ["launch", "prewarm", "die_with_parent", "RankInfo", "rank_info", "device",
           "ddp_kwargs", "restart_clock", "in_torchrun", "scratch_dir", "RunResult", "RankResult", "ErrorInfo",
           "DistributedRunError", "LaunchInterrupted", "sanitize"]
