"""Build an output folder without leaving it half-built: the workshop kit and the site are
written into a temporary folder beside their parts, and moved into place only when the whole
build has succeeded."""
from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged(out, prefix: str):
    """A temporary folder inside `out` (created if need be) for the block to write into. When
    the block ends, each entry written there replaces `out`'s entry of the same name (a folder
    whole); `out`'s other entries stay. When the block raises, nothing in `out` changes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=out))
    try:
        yield tmp
        for entry in sorted(tmp.iterdir()):
            target = out / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
            entry.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
