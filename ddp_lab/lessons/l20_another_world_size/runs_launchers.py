"""Lesson 20's scenarios 2 and 3: the script `runs_script.py`, started on 2 local ranks by the old
launcher (`python -m torch.distributed.launch`) or by torchrun. The launcher's agent runs here, in
a rank the course launched (one process, as a shell on a node would run it); its 2 workers are
fresh interpreters running the script by its path.

What each launcher passes (torch 2.13 source):
- torch/distributed/launch.py:165-178: `--use-env` is False by default, so the old launcher
  appends `--local-rank=<local rank>` to the script's arguments (torch/distributed/run.py:965-966;
  the dashed spelling since 2.0, launch.py:106-115);
- torchrun's parser has no `use_env` (run.py:796-807 returns True), so it passes no argument at
  all: only the LOCAL_RANK variable, which both set (not every launcher does: runs_script.py).
"""
from __future__ import annotations

import glob
import json
import os
import tempfile
import warnings

from ...launching.rankinfo import RANK_VARIABLES, environ
from . import runs_script

SCRIPT = runs_script.__file__


def run_script(launcher: str = "torchrun", parser: str = "underscore", nproc: int = 2) -> dict:
    """`launcher --standalone --nproc-per-node 2 runs_script.py`, the script reading its local
    rank the `parser` way (runs_script.py's PARSER; launcher: "launch", the
    old `python -m torch.distributed.launch`, or "torchrun"). Raises what the launcher raises
    (ChildFailedError when a worker fails); prints what each worker said first."""
    if launcher == "launch":
        from torch.distributed.launch import main
    else:
        from torch.distributed.run import main
    with (tempfile.TemporaryDirectory(prefix="ddp-lab-l20-") as out,
          environ({runs_script.OUT: out, runs_script.PARSER: parser}, drop=RANK_VARIABLES)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                main(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", SCRIPT])
            finally:  # on stdout: a launch that failed still tells
                workers = read_workers(out)
                print("workers:", json.dumps(workers))
                warned = [f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught]
                print("launcher warned:", json.dumps(warned))
    return {"workers": workers, "warned": warned, "local_ranks": [w["local_rank"] for w in workers],
            "env_local_ranks": [w["env_local_rank"] for w in workers],
            "misread": sum(w["local_rank"] != w["env_local_rank"] for w in workers)}


def read_workers(out: str) -> list[dict]:
    found = []
    for path in sorted(glob.glob(os.path.join(out, "worker-*.json"))):
        with open(path) as f:
            found.append(json.load(f))
    return found
