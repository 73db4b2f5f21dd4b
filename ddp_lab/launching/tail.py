"""The ranks' output while they run: `launch(..., output=sink)` calls `sink(rank, stream, line)`
for each line a rank writes to its stdout or stderr ("stdout"/"stderr"), as it is written, the
way torchrun's `--tee` tails its workers' log files (torch/distributed/elastic/multiprocessing/
tail_log.py). A line is passed once it is complete; a part line that waited `PART_WAIT` s (a
progress bar that rewrites itself with "\\r") or is left when the rank ends is passed as it is.
What the ranks wrote is still in each `RankResult.stdout`/`stderr` afterwards.
"""
from __future__ import annotations

import time

POLL = 0.05  # seconds between reads of the ranks' files
PART_WAIT = 1.0
CHUNK = 1 << 16


class Tail:
    """Follows `files` ({(rank, stream): path}) and passes their lines to `sink`."""

    def __init__(self, files: dict, sink):
        self.sink = sink
        self.files = dict(files)
        self.offsets = {key: 0 for key in files}
        self.parts = {key: b"" for key in files}
        self.since = {key: 0.0 for key in files}  # when the part line began to wait
        self.last = 0.0

    def poll(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < POLL:
            return
        self.last = now
        for key, path in self.files.items():
            self._read(key, path, now)

    def _read(self, key, path: str, now: float) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(self.offsets[key])
                data = f.read(CHUNK * 16)
        except OSError:
            return
        if data:
            self.offsets[key] += len(data)
            if not self.parts[key]:
                self.since[key] = now
            lines = (self.parts[key] + data).split(b"\n")
            self.parts[key] = lines.pop()
            for line in lines:
                self._pass(key, line + b"\n")
            if self.parts[key] and lines:
                self.since[key] = now
        if self.parts[key] and now - self.since[key] >= PART_WAIT:
            self._pass(key, self.parts[key])
            self.parts[key] = b""

    def _pass(self, key, line: bytes) -> None:
        rank, stream = key
        try:
            self.sink(rank, stream, line.decode("utf-8", errors="replace"))
        except Exception:  # noqa: BLE001 - a sink that fails must not stop the launch
            pass

    def close(self) -> None:
        """Everything left: the rest of each file, then each part line."""
        while True:
            before = dict(self.offsets)
            self.poll(force=True)
            if before == self.offsets:
                break
        for key, part in self.parts.items():
            if part:
                self._pass(key, part)
                self.parts[key] = b""
