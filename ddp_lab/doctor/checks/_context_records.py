"""A rank's records file (context.py): one JSON line per record, each on disk before the script
goes on (a rank that hangs or dies later still told us this), except where a step may batch them:

- the lines written while a step ends (the step's end, what the step-end hooks add, the next
  step's begin) go out as one write when the step-end hooks have run (`holding`);
- `later=True` (a check's per-step record that only a finished step needs, such as the logged
  check's loss values) waits for the next line written at once or the step's end. A rank killed
  in the middle of a step loses those of that step only; nothing a hang's diagnosis reads.
"""
from __future__ import annotations

import json
from typing import Any

_ENCODE = json.JSONEncoder(default=str).encode  # one encoder, not one made per line (json.dumps)


class RecordsFile:
    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")
        self._pending: list[str] = []
        self.holding = False

    def write(self, line: dict, later: bool = False) -> None:
        try:
            text = _ENCODE(line) + "\n"
        except (ValueError, TypeError):
            return
        if later or self.holding:
            self._pending.append(text)
            return
        if self._pending:
            text = "".join(self._pending) + text
            self._pending.clear()
        self._out(text)

    def step(self, step: int, key: str, at: float) -> None:
        """{"step": step, key: at}, formatted as json.dumps formats it (a float's repr): the two
        lines of every step's end without the encoder's cost."""
        self._pending.append(f'{{"step": {int(step)}, "{key}": {float(at)!r}}}\n')
        if not self.holding:
            self.release()

    def release(self) -> None:
        """The step's end is written: what was held goes out, in one write."""
        self.holding = False
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            self._out(text)

    def _out(self, text: str) -> None:
        try:
            self._f.write(text)
            self._f.flush()
        except (OSError, ValueError):
            pass

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> None:
        self.release()
        self._f.close()


def read_records(path: str) -> dict:
    """A rank's records file (JSON lines, written as it went) as {key: value}, with "steps"."""
    out: dict[str, Any] = {}
    steps: dict[int, dict] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return {"steps": []}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short when the rank was killed
        if "key" in item:
            out[item["key"]] = item["value"]
        elif "add" in item:
            out.setdefault(item["add"], []).append(item["item"])
        elif "step" in item:
            s = steps.setdefault(item["step"], {"begin": None, "end": None})
            s.update({k: v for k, v in item.items() if k in ("begin", "end")})
    out["steps"] = [steps[k] for k in sorted(steps)]
    return out
