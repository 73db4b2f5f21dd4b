"""Lesson 06 under torchrun. `torchrun_job` runs on a launched rank and starts torchrun's agent;
the agent starts `nproc` workers, each this module as a script:
`torchrun ... -m ddp_lab.lessons.l06_logging_and_debugging.runs_torchrun --vocab-size N`.

`@record` (torch.distributed.elastic) writes this worker's exception, with its traceback, to
the error file torchrun gives it, so torchrun's summary can show what failed where.
"""
from __future__ import annotations

import argparse
import tempfile
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ...launching import die_with_parent
from .runs import VOCAB, train_tokens

WORKER = __spec__.name  # this module (its __name__ is "__main__" where it runs as a worker)


def torchrun_job(vocab_size: int = len(VOCAB), nproc: int = 2) -> dict:
    """Run `train_tokens` under torchrun (its elastic agent runs here; it starts `nproc`
    workers of this module). If a worker fails, torchrun raises ChildFailedError."""
    from torch.distributed.run import main as torchrun

    with tempfile.TemporaryDirectory(prefix="ddp-lab-torchrun-") as logs:  # its error files
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
                  f"--log-dir={logs}", "-m", WORKER,
                  f"--vocab-size={vocab_size}"])
    return {"nproc": nproc}


@record
def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab-size", type=int, required=True)
    args = parser.parse_args(argv)
    # short: a worker whose peer is gone gives up soon, even if nobody stops it
    dist.init_process_group(timeout=timedelta(seconds=20))
    try:
        train_tokens(vocab_size=args.vocab_size)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    die_with_parent()  # torchrun's agent runs inside a launched rank: go when it goes
    main()
