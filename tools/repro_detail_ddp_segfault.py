"""Minimal reproduction: DDP's constructor segfaults when the process group is created under
TORCH_DISTRIBUTED_DEBUG=DETAIL (torch 2.13.0+cpu, gloo). Plain torch, mp.spawn, world size 1.

    python tools/repro_detail_ddp_segfault.py            # the crash: group created under DETAIL
    python tools/repro_detail_ddp_segfault.py --after    # the workaround: DETAIL set after init

Expected: both forms print "DDP built, one step done" and exit 0.
Actual on torch 2.13.0+cpu (gloo, Linux x86-64): in the first form the backend is a
_ProcessGroupWrapper (DETAIL's collective checker) and the child dies with SIGSEGV (exit code
-11) inside DistributedDataParallel.__init__ (_ddp_init_helper); with `--after` the backend is
plain ProcessGroupGloo and DDP works. No code outside torch is involved.
"""
import os
import platform
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def worker(rank: int, world_size: int, after: bool, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if after:
        dist.set_debug_level(dist.DebugLevel.DETAIL)  # the group stays unwrapped
    backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    print(f"debug level {dist.get_debug_level()}, backend {backend}", flush=True)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    model(torch.randn(2, 4)).sum().backward()
    print("DDP built, one step done", flush=True)
    dist.destroy_process_group()


def main() -> int:
    after = "--after" in sys.argv[1:]
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.platform()}")
    print("form:", "DETAIL set after init_process_group" if after else
          "process group created under TORCH_DISTRIBUTED_DEBUG=DETAIL")
    if not after:  # read when the child imports torch; the group it creates is then wrapped
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.spawn(worker, args=(1, after, port), nprocs=1, join=False)
    try:
        ctx.join()
    except mp.ProcessExitedException as exc:
        print(f"child exited with code {exc.exit_code} ({exc.signal_name or 'no signal'})")
        print("ACTUAL: the crash (expected: 'DDP built, one step done', exit 0)")
        return 1
    print("ACTUAL: as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
