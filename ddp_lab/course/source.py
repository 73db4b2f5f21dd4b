"""`show(obj)`: print the source of lesson code (functions, classes), so a notebook shows the one
copy that lives in ddp_lab/lessons/ rather than a second one."""
from __future__ import annotations

import inspect
import textwrap


def source(obj) -> str:
    """The source code of a lesson function or class, dedented."""
    return textwrap.dedent(inspect.getsource(obj))


def show(*objs) -> None:
    """Print the source of each of `objs`, a blank line between them."""
    for i, obj in enumerate(objs):
        if i:
            print()
        print(source(obj).rstrip())
