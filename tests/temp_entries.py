"""Nothing a run makes is left in the temporary folder (issue 47): the launcher makes its folder
there (`ddp-lab-*`) and the ranks theirs inside it (`rankinfo.scratch_dir()`), and it removes it
whichever way the ranks end, killed at the timeout included. The tests look at a temporary
folder of their own, not the system's, where other runs come and go."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

OURS = "ddp-lab-*"


@contextlib.contextmanager
def temp_folder_of_its_own(folder: Path):
    """`folder` is the temporary folder for the block: this process's (tempfile.tempdir: where
    the launcher makes its own) and, given the environment this yields (`launch(..., env=...)`),
    the ranks' too, so that a rank making its own folder outside the launch's scratch folder is
    caught as well; afterwards the block fails if a `ddp-lab-*` entry is left there."""
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield {"TMPDIR": str(folder)}
    finally:
        tempfile.tempdir = saved
    left = sorted(p.name for p in Path(folder).glob(OURS))
    assert left == [], f"left in the temporary folder: {left}"
