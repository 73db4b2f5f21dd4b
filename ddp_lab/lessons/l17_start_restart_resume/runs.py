"""What the scenarios of lesson 17 share. Runs on a rank."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import torch.distributed as dist

from ...launching.rankinfo import rank_info, scratch_dir


def refuse_under_torchrun(scenario: str, why: str) -> None:
    """Raise, naming the command to use, when this process is one of torchrun's workers (the
    `torchrun -m ddp_lab run 17 ...` mode) rather than a rank the course's launcher started."""
    if os.environ.get("TORCHELASTIC_RUN_ID") and not os.environ.get("DDP_LAB_RANK_PROCESS"):
        raise RuntimeError(f"17/{scenario} cannot run under torchrun: {why}. Run it with "
                           f"`ddp-lab run 17 {scenario}` (or from notebook 17) instead")


@contextlib.contextmanager
def shared_dir():
    """A folder every rank of this launch sees: rank 0 makes it and broadcasts its path; every
    rank marks itself done on the way out, and the last one removes it (no collective, so it runs
    when a rank leaves with an error too; a rank killed at the timeout does not, so it lives in
    the launch's scratch folder, which the launcher removes)."""
    info = rank_info()
    box = [tempfile.mkdtemp(prefix="ddp-lab-l17-", dir=scratch_dir()) if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    try:
        yield box[0]
    finally:
        open(os.path.join(box[0], f".rank{info.rank}-done"), "w").close()
        if all(os.path.exists(os.path.join(box[0], f".rank{r}-done")) for r in range(info.world_size)):
            shutil.rmtree(box[0], ignore_errors=True)


