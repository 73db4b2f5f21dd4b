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
# c10d's own wordings of a port: "port: 35731, useIpv6" (a server that cannot listen) and
# "connect to (192.0.2.1, 35731)" (a client that cannot connect). The host, a dotted name or
# address, stays: it says where.
_PORT = re.compile(r"\bport: \d+")
_HOST_PORT = re.compile(r"\(((?:\d{1,3}\.){3}\d{1,3}|localhost|[\w-]+(?:\.[\w-]+)+), \d+\)")
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
    text = _PORT.sub("port: <port>", text)
    text = _HOST_PORT.sub(lambda m: f"({m.group(1)}, <port>)", text)
    return _PID.sub(lambda m: f"{m.group(1)} <pid>", text)
