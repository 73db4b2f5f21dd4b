"""`sanitize`: remove from a text what varies between runs (addresses and ports, memory
addresses, machine paths, clock times, PIDs) or between releases of the libraries (the line
numbers of their own source in tracebacks, stacks and warnings), so printed results compare
equal under nbval, and a new PyTorch release shows only its behaviour in a diff.
The lowest layer of the package: it imports only frames (which files are the course's)."""
from __future__ import annotations

import re
import sysconfig

from .frames import HOME

_ADDRESS = re.compile(r"\[?(?:\d{1,3}\.){3}\d{1,3}\]?:\d+|\[?localhost\]?:\d+")
_HEX = re.compile(r"0x[0-9a-fA-F]{6,}")
# A path to torch's, the course's or a C++ library's file -> the path from that folder on. The part
# before may be absolute or relative: torch's own shortening (torch/utils/_traceback.py:133
# shorten_filename, which dynamo's guard comments use, torch/_dynamo/guards.py:811) cuts a path
# at the folder it shares with torch's install, so the course's files print as
# "ork/main/ddp_lab/..." with the venv outside the checkout ("/" shared: it drops one letter
# more) or "ddp_lab/..." with the venv inside it.
_PATH = re.compile(r"[^\s\"',:()\[\]]*/((?:torch|ddp_lab|third_party)/[^\s\"',:()\[\]]*)")
_PACKAGES = re.compile(r"(?:/[^\s\"',:()\[\]]+)*/(?:site|dist)-packages/")  # .../site-packages/x -> x
_PID = re.compile(r"\b(pid|PID|process)[ =:]+\d+")
# c10d's own wordings of a port: "port: 35731, useIpv6" (a server that cannot listen) and
# "connect to (192.0.2.1, 35731)" (a client that cannot connect). The host, a dotted name or
# address, stays: it says where.
_PORT = re.compile(r"\bport: \d+")
_HOST_PORT = re.compile(r"\(((?:\d{1,3}\.){3}\d{1,3}|localhost|[\w-]+(?:\.[\w-]+)+), \d+\)")
_CPP_LOG = re.compile(r"\b[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?")  # glog: I1202 13:01:02.123 4567
_CLOCK = re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b")
# Where a library's source line is named: a traceback's or faulthandler's frame
# (`File "...", line 12, in f` / `line 12 in f`), a warning (`.../x.py:12: UserWarning: ...`,
# torch's glog-style `W1204 16:14:01.03 1552 .../cpp_extension.py:183] ...`), a C++ source
# (`[.../gloo/transport/tcp/pair.cc:553]`, `at .../ProcessGroupGloo.cpp:1017`).
_FRAME_LINE = re.compile(r'(?P<keep>File "(?P<path>[^"]+)"), line \d+(?=,? in )')
_WARNING_LINE = re.compile(r"(?P<path>[^\s\"'()\[\]]+\.py):\d+(?=: \w*(?:Warning|Error)\b|\])")
_CPP_LINE = re.compile(r"(?P<path>[^\s\"'()\[\]:]+\.(?:cpp|cc|cu|cuh|h|hpp)):\d+\b")
_STDLIB = sysconfig.get_paths()["stdlib"].replace("\\", "/").rstrip("/") + "/"


def library_file(path: str) -> bool:
    """A file of torch, another installed package (the course's own excepted) or Python's
    standard library: its line numbers change with each release. The course's files and the
    learner's (notebook cells, their own modules) are not."""
    path = path.replace("\\", "/")
    if path.startswith("<frozen"):
        return True
    packages = re.search(r"/(?:site|dist)-packages/(.*)", path)
    if packages:
        return not packages.group(1).startswith(HOME)
    return (path.startswith(_STDLIB) or path.startswith(("torch/", "third_party/"))
            or bool(re.search(r"/(?:torch|third_party)/", path)))


def _without_library_lines(text: str) -> str:
    text = _FRAME_LINE.sub(lambda m: m.group("keep") if library_file(m.group("path"))
                           else m.group(0), text)
    text = _WARNING_LINE.sub(lambda m: m.group("path") if library_file(m.group("path"))
                             else m.group(0), text)
    return _CPP_LINE.sub(lambda m: m.group("path"), text)  # the course has no C++ of its own


def sanitize(text: str) -> str:
    """Remove what varies between runs: addresses and ports, memory addresses, machine paths,
    and the line numbers of libraries' own source (their file and function stay)."""
    text = _without_library_lines(text)
    text = _ADDRESS.sub("<addr>", text)
    text = _HEX.sub("0x…", text)
    text = _PATH.sub(lambda m: m.group(1), text)
    text = _PACKAGES.sub("", text)
    text = _CPP_LOG.sub(lambda m: m.group(0)[0] + "<time>", text)
    text = _CLOCK.sub("<time>", text)
    text = _PORT.sub("port: <port>", text)
    text = _HOST_PORT.sub(lambda m: f"({m.group(1)}, <port>)", text)
    return _PID.sub(lambda m: f"{m.group(1)} <pid>", text)
