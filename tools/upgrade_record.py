"""What the tour and strict nbval see in one environment, recorded as JSON for
`tools/upgrade_check.py` (which runs this with each environment's own Python).

    python tools/upgrade_record.py tour OUT.json
        every scenario of every lesson, broken then fixed: status, the root cause's headline,
        and whatever differs from the declaration

    DDP_LAB_UPGRADE_RECORD=OUT.json PYTHONPATH=tools python -m pytest notebooks/ -p upgrade_record
        strict nbval as `pytest` runs it (pyproject's options, notebooks/sanitize.cfg), plus, for
        every cell, whether it passed and, for a failed one, nbval's reason and both outputs as
        nbval compared them (sanitized, keyed by stream or MIME type)
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

_cells: list[dict] = []


def record_tour(path: str) -> int:
    import io

    import torch

    from ddp_lab.course.tour import tour

    with tempfile.TemporaryDirectory(prefix="ddp-lab-upgrade-") as figures:
        rows = tour(out=figures, progress=False, stream=io.StringIO())
    scenarios = {}
    for row in rows:
        for variant in ("broken", "fixed"):
            result = getattr(row, variant)
            root = result.root_cause
            measured = row.scenario.variant(variant).measured_on(torch.__version__)
            scenarios[f"{row.scenario.key} {variant}"] = {
                "status": result.status,
                "headline": f"rank {root.rank}: {root.headline}" if root else "ok",
                "problems": [p.split(": ", 1)[1] for p in row.problems
                             if p.startswith(variant + ":")],
                # where the declaration is measured to hold only some of the time on this torch
                "measured": measured.describe() if measured else None}
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "scenarios": scenarios}, f, indent=1)
    missed = [k for k, v in scenarios.items() if v["problems"]]
    known = [k for k in missed if scenarios[k]["measured"]]
    print(f"torch {torch.__version__}: {len(scenarios) - len(missed)}/{len(scenarios)} scenario "
          f"variants as declared" + (f", {len(known)} more known nondeterministic on this build "
                                     f"({', '.join(known)})" if known else ""))
    return 0 if len(missed) == len(known) else 1


def _compared(item, outputs) -> dict[str, str]:
    """`outputs` as nbval compares them: streams coalesced and keyed by name, MIME data by type,
    what nbval skips left out, each text through notebooks/sanitize.cfg."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    skip = item.parent.skip_compare
    keyed: dict[str, list[str]] = {}
    for out in transform_streams_for_comparison(coalesce_streams(list(outputs))):
        for key, value in out.items():
            if key in skip:
                continue
            pairs = value.items() if key == "data" else [(key, value)]
            for name, text in pairs:
                if name not in skip:
                    keyed.setdefault(name, []).append(str(item.sanitize(text)))
    return {name: "\n".join(texts) for name, texts in keyed.items()}


def pytest_runtest_makereport(item, call):
    """Each notebook cell's outcome, with both outputs when it failed."""
    if call.when != "call" or not hasattr(item, "cell_num"):
        return
    record = {"notebook": os.path.basename(str(item.fspath)), "cell": item.cell_num,
              "passed": call.excinfo is None}
    if call.excinfo is not None:
        exc = call.excinfo.value
        record["why"] = str(exc)
        record["traceback"] = getattr(exc, "inner_traceback", "") or ""
        record["expected"] = _compared(item, item.cell.outputs)
        record["obtained"] = _compared(item, item.test_outputs or [])
        record["source"] = item.cell.source
    _cells.append(record)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("DDP_LAB_UPGRADE_RECORD")
    if path:
        with open(path, "w") as f:
            json.dump({"cells": _cells}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "tour":
        sys.exit(__doc__)
    sys.exit(record_tour(sys.argv[2]))
