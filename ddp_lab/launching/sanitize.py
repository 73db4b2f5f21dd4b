"""`sanitize`: remove from a text what varies between runs (addresses and ports, memory
addresses, machine paths, clock times, PIDs), so printed results compare equal under nbval.
The lowest layer of the package: it imports nothing from ddp_lab."""
from __future__ import annotations

import re

_ADDRESS = re.compile(r"\[?(?:\d{1,3}\.){3}\d{1,3}\]?:\d+|\[?localhost\]?:\d+")
_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")
_PATH = re.compile(r"(?:/[^\s\"',:()\[\]]+)+/((?:torch|ddp_lab|third_party)/[^\s\"',:()\[\]]*)")
_PACKAGES = re.compile(r"(?:/[^\s\"',:()\[\]]+)*/(?:site|dist)-packages/")  # .../site-packages/x -> x
_PID = re.compile(r"\b(pid|PID|process)[ =:]+\d+")
_CPP_LOG = re.compile(r"\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?")  # glog: I1202 13:01:02.123 4567
_CLOCK = re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b")


def sanitize(text: str) -> str:
    """Remove what varies between runs: addresses and ports, memory addresses, machine paths."""
    text = _ADDRESS.sub("<addr>", text)
    text = _HEX.sub("0x…", text)
    text = _PATH.sub(lambda m: m.group(1), text)
    text = _PACKAGES.sub("", text)
    text = _CPP_LOG.sub(lambda m: m.group(0)[0] + "<time>", text)
    text = _CLOCK.sub("<time>", text)
    return _PID.sub(lambda m: f"{m.group(1)} <pid>", text)
