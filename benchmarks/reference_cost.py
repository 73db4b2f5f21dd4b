"""What `ddp-lab watch --reference` costs: scripts the reference serves (examples/scripts/train_ddp.py
and the fixed scripts of the blind cases of its class) watched on 2 ranks without and with
--reference (K steps, default 3), alternately, in one run on this machine. Per script: the whole
watch call's seconds each way, and within the --reference call the watched run's launch and the
reference's (one process for K steps: its launch, imports and K steps), as the report's note says
them (medians over the repeats).

    .venv/bin/python benchmarks/reference_cost.py [--repeat 3] [--steps 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = {
    "train_ddp.py": (ROOT / "examples" / "scripts" / "train_ddp.py", []),
    "b04 fixed.py": (ROOT / "tests" / "corpus" / "watch" / "b04_lr_scaled_per_rank_batch" / "fixed.py", []),
    "b32 fixed.py": (ROOT / "tests" / "corpus" / "watch" / "b32_contrastive_local_negatives" / "fixed.py", []),
    "b33 fixed.py": (ROOT / "tests" / "corpus" / "watch" / "b33_advantage_norm_per_rank" / "fixed.py", []),
}


def once(path: Path, args: list, reference) -> tuple[float, dict]:
    from ddp_lab.doctor.watch.script import watch_script

    start = time.perf_counter()
    report = watch_script(str(path), args, nproc=2, timeout=300, reference=reference)
    took = time.perf_counter() - start
    if report.status != "ok":
        raise RuntimeError(report.text())
    ref = getattr(report.evidence, "reference", None) or {}
    if reference and ref.get("refused"):
        raise RuntimeError(f"{path.name}: the reference refused it: {ref['refused']}")
    return took, ref.get("seconds", {})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    print("| script | watch s | watch --reference s | of which: the run on 2 ranks s | the reference s |")
    print("|---|---|---|---|---|")
    for name, (path, script_args) in SCRIPTS.items():
        plain, with_ref, watched, reference = [], [], [], []
        for _ in range(args.repeat):
            plain.append(once(path, script_args, None)[0])
            took, seconds = once(path, script_args, args.steps)
            with_ref.append(took)
            watched.append(seconds.get("watched", 0.0))
            reference.append(seconds.get("reference", 0.0))
        med = statistics.median
        print(f"| {name} | {med(plain):.2f} | {med(with_ref):.2f} | {med(watched):.2f} | "
              f"{med(reference):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(ROOT))
    sys.exit(main())
