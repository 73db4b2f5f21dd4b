"""A worker of lesson 06's torchrun job: `torchrun ... -m
ddp_lab.lessons.l06_logging_and_debugging.torchrun_worker --vocab-size N`.

`@record` (torch.distributed.elastic) writes this worker's exception, with its traceback, to
the error file torchrun gives it, so torchrun's summary can show what failed where.
"""
from __future__ import annotations

import argparse
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ..._rank import _die_with_parent
from .ranks import train_tokens


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
    _die_with_parent()  # torchrun's agent runs inside a launched rank: go when it goes
    main()
