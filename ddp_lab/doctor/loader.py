"""The CLI's inputs: loading `path/to/file.py:Name` (shipped to the ranks by value, since they
cannot import it by name) and evaluating `--input "torch.randn(8, 16)"`."""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys

from .errors import DoctorInputError
from .frames import last_frames as _last_frames


def load_target(spec: str):
    """`path/to/file.py:Name` -> (the object, the loaded module)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise DoctorInputError(f"give the module as path/to/file.py:Name, got {spec!r}")
    if not os.path.isfile(path):
        raise DoctorInputError(f"no such file: {path}")
    module = load_file(path)
    if not hasattr(module, name):
        raise DoctorInputError(f"{path} has no {name!r}; it defines: {', '.join(candidates(module)) or 'no module class'}")
    return getattr(module, name), module


def load_file(path: str):
    import cloudpickle

    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    mod_name = f"ddp_lab_doctor_target_{stem}"
    spec = importlib.util.spec_from_file_location(mod_name, os.path.abspath(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)  # so the file's own imports of its neighbours work
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[mod_name]
        raise DoctorInputError(f"importing {path} raised {type(exc).__name__}: {exc}\n"
                               + _last_frames(exc)) from exc
    cloudpickle.register_pickle_by_value(module)  # the ranks cannot import it by name
    return module


def candidates(module) -> list[str]:
    import torch.nn as nn

    return [n for n, v in vars(module).items() if not n.startswith("_") and inspect.isclass(v)
            and issubclass(v, nn.Module) and v.__module__ == module.__name__]


def eval_input(expr: str, namespace: dict | None = None, option: str = "--input"):
    """`--input "torch.randn(8, 16)"`: evaluated with torch, nn, F, math and the file's names."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    scope = dict(namespace or {}, torch=torch, nn=nn, F=F, math=math)
    try:
        return eval(expr, scope)  # noqa: S307 - the user's own expression, on their own machine
    except Exception as exc:
        raise DoctorInputError(f"{option} {expr!r} raised {type(exc).__name__}: {exc}") from exc


def eval_loss(expr: str, namespace: dict | None = None):
    """`--loss "lambda out, batch: out[0].mean()"`: a callable (output[, batch]) -> loss."""
    fn = eval_input(expr, namespace, "--loss")
    if not callable(fn):
        raise DoctorInputError(f"--loss {expr!r} gives a {type(fn).__name__}, not a function "
                               "(output) or (output, batch) -> loss")
    return fn


def parse_ddp(text: str) -> dict:
    """`--ddp find_unused_parameters=True,bucket_cap_mb=25` -> a dict of Python values; the
    names are checked against DDP's signature by the doctor."""
    import ast

    out = {}
    for item in re.split(r",(?=\s*\w+\s*=)", text):
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier():
            raise DoctorInputError(f"--ddp takes NAME=VALUE pairs separated by commas, got {item!r}")
        try:
            out[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError) as exc:
            raise DoctorInputError(f"--ddp {name.strip()}={value.strip()}: not a Python value "
                                   "(True, False, a number, a string in quotes)") from exc
    return out
