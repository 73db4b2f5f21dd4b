"""`ddp_lab.watch`: the function `watch(train_step, model, batches, ...)` (ddp_lab/doctor/watch),
and `python -m ddp_lab.watch [options] train.py [args]`, which runs a training script unchanged
with watch's checks attached: on real ranks of its own (as `ddp-lab watch train.py`), or, inside
a torchrun job (`torchrun --nproc-per-node 2 -m ddp_lab.watch train.py`), on torchrun's ranks,
the ranks' records handed over through the job's own store and judged on rank 0."""
from __future__ import annotations

import inspect
import sys
import types

from .doctor.watch import WatchInputError, watch
from .doctor.watch.script import WatchScriptError, watch_script

__all__ = ["watch", "watch_script", "WatchInputError", "WatchScriptError"]


class _CallableModule(types.ModuleType):
    """This module, callable as the function `watch` (`ddp_lab.watch(...)` calls it whichever
    of the two `ddp_lab.watch` names)."""

    def __call__(self, *args, **kwargs):
        return watch(*args, **kwargs)


def main(argv=None) -> int:
    from .launching.rankinfo import in_torchrun

    if in_torchrun():
        from .doctor.watch.torchrun import torchrun_main
        return torchrun_main(argv)
    from .cli import main as cli_main
    return cli_main(["watch", *(sys.argv[1:] if argv is None else argv)])


__signature__ = inspect.signature(watch)
if __name__ == "__main__":
    sys.exit(main())
sys.modules[__name__].__class__ = _CallableModule
