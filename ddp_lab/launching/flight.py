"""PyTorch's flight recorder in every launch: each rank's recorded collectives, and where the
ranks part.

torch records every collective a rank enters (gloo and NCCL alike) by default: its ring buffer
holds `TORCH_FR_BUFFER_SIZE` entries (the older name `TORCH_NCCL_TRACE_BUFFER_SIZE` is still
read), 2000 when neither is set, and 0 turns recording off (torch 2.13's
torch/csrc/distributed/c10d/FlightRecorder.hpp:110-114). So ddp_lab sets nothing: a rank dumps
its record (`torch._C._distributed_c10d._dump_fr_trace()`) for every launch unless recording is
off -- when its function returns or raises, and, when the launcher stops a hung rank, from a
daemon thread that waits on a FIFO: the main thread is then blocked inside a C++ collective (the
wait releases the GIL), where no Python signal handler would run.

With `TORCH_FR_DUMP_TEMP_FILE` set (a path prefix), the rank also writes its record to that
prefix followed by its rank, the file name NCCL's watchdog gives its own dumps, so that PyTorch's
analyser (`python -m torch.distributed.flight_recorder.fr_trace DIR`) reads the folder. On gloo,
torch 2.13 writes no such file itself, not even on gloo's own timeout (measured).

The launcher parses the record into plain `Collective`s (they pickle without torch.distributed),
and `divergence` finds the first collective where the ranks differ: one rank entered it and another
did not, or they entered different ops, sizes or dtypes (judged by torch's own trace analyser,
`torch.distributed.flight_recorder`'s `Op.match`).
"""
from __future__ import annotations

import os
import pickle
import re
import threading
import time
from dataclasses import dataclass

ENV = "TORCH_FR_BUFFER_SIZE"  # entries kept per rank (a ring buffer: the newest are kept)
OLD_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # its older name; ENV wins when both are set
DEFAULT = 2000  # torch's default size when neither is set
FILE_ENV = "TORCH_FR_DUMP_TEMP_FILE"  # a path prefix: the dump of rank r is PREFIX + str(r)
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Byte": "uint8", "Bool": "bool", "Char": "int8"}


@dataclass(frozen=True)
class Collective:
    """One collective a rank entered, as the flight recorder saw it."""

    seq: int                 # the process group's collective sequence number (#1, #2, ...)
    op: str                  # "all_reduce", "broadcast", ...
    sizes: tuple             # input tensor shapes, e.g. ((4,),)
    dtypes: tuple            # input dtypes as torch names them ("float32")
    state: str = ""          # "scheduled", "started", "completed" (gloo records "scheduled")
    group: str = "0"         # process group id
    backend: str = "gloo"
    out_sizes: tuple = ()
    out_dtypes: tuple = ()
    created: float = 0.0     # wall-clock time the rank entered it (s since the epoch)

    @property
    def shape(self) -> str:
        """`[4] float32` (several tensors joined by `, `)."""
        parts = [f"[{', '.join(map(str, s))}] {d}" for s, d in zip(self.sizes, self.dtypes)]
        return ", ".join(parts) or "no tensor"

    def __str__(self) -> str:
        return f"{self.op} {self.shape}"

    def _event(self) -> dict:
        """The record's own fields, as torch's trace analyser reads them."""
        back = {v: k for k, v in _DTYPES.items()}
        return {"profiling_name": f"{self.backend}:{self.op}", "state": self.state,
                "process_group": (self.group, ""), "input_sizes": [list(s) for s in self.sizes],
                "output_sizes": [list(s) for s in self.out_sizes], "collective_seq_id": self.seq,
                "p2p_seq_id": 0, "input_dtypes": [back.get(d, d) for d in self.dtypes],
                "output_dtypes": [back.get(d, d) for d in self.out_dtypes],
                "time_created_ns": 0}


def parse(blob: bytes) -> list[Collective]:
    """A `_dump_fr_trace()` pickle -> the collectives it recorded, oldest first (p2p left out)."""
    record = pickle.loads(blob)
    out = []
    for e in record.get("entries", []):
        backend, _, name = e.get("profiling_name", "").partition(":")
        if e.get("is_p2p") or not name:
            continue
        out.append(Collective(
            seq=int(e["collective_seq_id"]), op=name.split(" ")[0],
            sizes=tuple(tuple(s) for s in e.get("input_sizes", [])),
            dtypes=tuple(_DTYPES.get(d, d) for d in e.get("input_dtypes", [])),
            state=str(e.get("state", "")),
            group=str(e.get("process_group", ("0",))[0]), backend=backend,
            out_sizes=tuple(tuple(s) for s in e.get("output_sizes", [])),
            out_dtypes=tuple(_DTYPES.get(d, d) for d in e.get("output_dtypes", [])),
            created=(e.get("time_created_ns") or 0) / 1e9))
    return out


# --- in the rank -------------------------------------------------------------------------------

def enabled() -> bool:
    """Whether this process records collectives, read as torch reads it: `TORCH_FR_BUFFER_SIZE`,
    else `TORCH_NCCL_TRACE_BUFFER_SIZE`, else 2000; recording is on when that is above 0."""
    size = os.environ.get(ENV, os.environ.get(OLD_ENV, str(DEFAULT)))
    try:
        return int(size) > 0
    except ValueError:  # torch itself refuses the value when it creates the process group
        return False


def _dump(path: str) -> None:
    try:
        import torch

        # Without stack traces: symbolising them imports torch._inductor (3 s in a cold rank).
        blob = torch._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)
    except Exception:  # no recorder in this build, or no process group: nothing to record
        return
    paths = [path]
    if os.environ.get(FILE_ENV):  # where NCCL's watchdog would write this rank's dump
        paths.append(os.environ[FILE_ENV] + os.environ.get("RANK", "0"))
    for target in paths:
        tmp = f"{target}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, target)


def arm(spec: dict) -> None:
    """In the rank, before its function runs: a daemon thread that dumps the record when the
    launcher opens the rank's FIFO (a hung main thread cannot run Python)."""
    fifo = spec.get("flight_fifo")
    if not fifo or not enabled():
        return

    def wait_and_dump():
        with open(spec["flight"] + ".tid", "w") as f:  # the launcher waits for it to end
            f.write(str(threading.get_native_id()))
        try:
            fd = os.open(fifo, os.O_RDONLY)  # blocks, GIL released, until the launcher asks
            os.close(fd)
        except OSError:
            return
        _dump(spec["flight"])
    threading.Thread(target=wait_and_dump, name="ddp-lab-flight-recorder", daemon=True).start()


def wait_thread_gone(paths: dict, pid: int, until: float) -> None:
    """In the launcher, after a hung rank dumped its record: wait (until `until`) for its dump
    thread to have exited, so the stack dump that follows lists the rank's own threads only
    (on a loaded machine the thread can still be ending; Linux's /proc shows it)."""
    try:
        with open(paths["flight"] + ".tid") as f:
            task = f"/proc/{pid}/task/{f.read().strip()}"
    except (OSError, KeyError):
        return
    while os.path.exists(task) and time.time() < until:
        time.sleep(0.005)


def dump_at_exit(spec: dict) -> None:
    """In the rank, when its function returned or raised: record what it entered."""
    if spec.get("flight") and enabled():
        _dump(spec["flight"])


# --- in the launcher ---------------------------------------------------------------------------

def prepare(paths: dict, workdir: str, r: int) -> None:
    """Add the rank's record file and FIFO to its paths (the FIFO exists before the rank starts)."""
    paths["flight"] = os.path.join(workdir, f"rank{r}.flight")
    paths["flight_fifo"] = os.path.join(workdir, f"rank{r}.flightfifo")
    os.mkfifo(paths["flight_fifo"])


def request(paths: dict) -> bool:
    """Ask a running rank to dump its record; False when no rank waits on the FIFO."""
    try:
        fd = os.open(paths["flight_fifo"], os.O_WRONLY | os.O_NONBLOCK)
    except (OSError, KeyError):
        return False
    os.close(fd)
    return True


def read(paths: dict) -> list[Collective] | None:
    """The rank's recorded collectives, or None when it left no record."""
    try:
        with open(paths["flight"], "rb") as f:
            return parse(f.read())
    except (OSError, KeyError, EOFError, pickle.UnpicklingError):
        return None
