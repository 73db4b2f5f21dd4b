"""The training script of lesson 20's scenarios 2 and 3, as a launcher runs it: by its path,
`python -u .../runs_script.py [what the launcher adds]`, once per rank. It only reads where it
is (no training) and writes what it found into the folder OUT names, for the launched rank that
ran the launcher. Its own settings come from the environment (OUT, PARSER), so that its command
line holds only what the launcher put there.

It imports only the standard library: a launcher starts a fresh interpreter per worker.
PARSER is how the script reads its local rank:
  underscore  `--local_rank`, as scripts for torch.distributed.launch before torch 2.0 did
  both        `--local-rank` and `--local_rank` (torch/distributed/launch.py:87's advice)
  env         the LOCAL_RANK variable (torchrun's way). torchrun and torch.distributed.launch set
              it; torchrun's --virtual-local-rank sets 0 on every worker (torch/distributed/
              run.py:700-707, elastic/agent/server/local_elastic_agent.py:484-487); mp.spawn,
              srun and mpirun set none; DeepSpeed's launcher sets it and passes --local_rank=N
              (deepspeed/launcher/launch.py:242, 261-262, at its commit edaa722)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

OUT, PARSER = "DDP_LAB_L20_OUT", "DDP_LAB_L20_PARSER"


def local_rank_parser(spelling: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train.py")
    if spelling == "underscore":
        parser.add_argument("--local_rank", type=int, default=0)
    elif spelling == "both":
        parser.add_argument("--local-rank", "--local_rank", type=int,
                            default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser


def local_rank(spelling: str, argv: list[str]) -> int:
    """The local rank as the script reads it."""
    if spelling == "env":
        return int(os.environ["LOCAL_RANK"])
    return local_rank_parser(spelling).parse_args(argv).local_rank


def main() -> None:
    spelling, out, argv = os.environ[PARSER], os.environ[OUT], sys.argv[1:]
    record = {"rank": int(os.environ["RANK"]), "env_local_rank": int(os.environ["LOCAL_RANK"]),
              "argv": argv}
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            record["local_rank"] = local_rank(spelling, argv)
    except SystemExit as exc:  # argparse's exit, status 2
        record.update(exit=exc.code, said=said.getvalue().strip().splitlines()[-1])
        raise
    finally:
        sys.stderr.write(said.getvalue())
        path = os.path.join(out, f"worker-{record['rank']}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        wait_for_peers(out)


def wait_for_peers(out: str, seconds: float = 10.0) -> None:
    """Wait until every worker has written its record (at most `seconds`): when one worker fails,
    the launcher stops the others, and a peer stopped before it parsed would leave no record."""
    import glob
    import time

    until = time.monotonic() + seconds
    while (len(glob.glob(os.path.join(out, "worker-*.json"))) < int(os.environ["LOCAL_WORLD_SIZE"])
           and time.monotonic() < until):
        time.sleep(0.01)


if __name__ == "__main__":
    main()
