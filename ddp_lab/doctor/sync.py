"""How the ranks of a doctor run report and compare notes: `emit` writes a record to the rank's
stdout (the launcher brings it back even from a rank that fails later), `records` reads them
back. The comparisons themselves (`ddp_lab.instruments.probes.gather`, `named_drift`) run on a process
group of the doctor's own (`new_group`), so that a module whose collectives are out of step
with the other ranks cannot pair them with the doctor's."""
from __future__ import annotations

import json

MARK = "@@ddp-lab-doctor "


def emit(key: str, value) -> None:
    """Write one record to this rank's stdout; the launcher brings it back, even from a rank that
    later fails or hangs."""
    print("\n" + MARK + json.dumps({"key": key, "value": value}), flush=True)


def records(stdout: str) -> dict:
    """The records a rank emitted, by key (the last one of each key wins)."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(MARK):
            try:
                item = json.loads(line[len(MARK):])
            except ValueError:
                continue
            out[item["key"]] = item["value"]
    return out


def new_group():
    import torch.distributed as dist

    return dist.new_group(backend="gloo")
