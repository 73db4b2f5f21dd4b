"""`ddp-lab watch` on the examples written as ordinary torchrun scripts (examples/scripts/: DDP,
FSDP2, compiled), unchanged: each runs through with the models it wraps seen, and no error- or
warning-level finding (they are correct scripts)."""
from pathlib import Path

import pytest

from ddp_lab.doctor.watch.script import watch_script

EXAMPLES = Path(__file__).parents[3] / "examples" / "scripts"


@pytest.mark.parametrize("name, models, steps", [
    ("train_ddp.py", "ddp(Sequential)", 8),
    ("train_fsdp2.py", "fsdp2(Block), fsdp2(Sequential)", 6),
    ("train_compiled.py", "ddp(Sequential), compiled(DistributedDataParallel)", 6),
])
def test_an_ordinary_script_runs_unchanged_and_is_clean(name, models, steps):
    report = watch_script(str(EXAMPLES / name), timeout=120)
    assert report.status == "ok" and report.steps == steps, report.text()
    assert f"models: {models}" in report.notes[0].replace("\n", " "), report.notes[0]
    assert not report.errors and not report.warnings, report.text()
