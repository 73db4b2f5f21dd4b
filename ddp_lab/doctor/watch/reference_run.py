"""`ddp-lab watch --reference`, the parent's side (issue 45; the check is checks/reference.py): the
distributed run is launched as usual with the reference check told its role ("watched"), then the
same script, unchanged, as the reference: one process (world size 1) for the first K optimizer
steps, fed the global batch of each step. The plan of how comes from what the watched run's rank 0
recorded: for each DataLoader that fed the compared steps, the parsed argument its batch size comes
from (scaled by the world size as the script parses it: a one-process user would pass
`--batch-size 32` for 2 x 16), else its batch size given x N. What the reference cannot serve is
said in a note (`refused`), never judged: no DataLoader feeds the steps, a batch sampler of the
script's own, a script that fails or stops at world size 1 before its first step.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from ...launching.launcher import launch
from ..checks.context import read_records
from .core import script_rank
from ..checks.reference import ENV, notes  # noqa: F401 - ENV: the ranks read their role there; notes: the report's

DEFAULT_STEPS = 3
LOADERS, BATCHES = "reference.loaders", "reference.batches"


def validate_steps(steps) -> int:
    """--reference-steps K: an integer >= 1."""
    if steps is True:
        return DEFAULT_STEPS
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"--reference-steps must be an integer >= 1, got {steps!r}")
    return steps


def validate_global_batch(value) -> int | None:
    """--global-batch G: None, or an integer >= 1."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"--global-batch must be an integer >= 1, got {value!r}")
    return value


def env(role: str, folder: str, steps: int, world: int, plan: dict | None = None) -> dict:
    return {ENV: json.dumps({"role": role, "dir": folder, "steps": steps, "world": world,
                             "plan": plan or {}})}


def make_plan(ranks: list[dict], nproc: int, steps: int) -> tuple[dict, str]:
    """(the reference's plan: {args: {dest: N}, loaders: {index: N x B}, said: [...]}, why it
    cannot be built or "")."""
    first = ranks[0] if ranks else {}
    loaders = {x["i"]: x for x in first.get(LOADERS, [])}
    drawn = sorted({b["i"] for b in first.get(BATCHES, []) if b.get("s", steps) < steps})
    if not drawn:
        return {}, ("no DataLoader fed the first step on rank 0: the script makes its batches "
                    "itself (tensors made or sliced in the loop), so the global batch of a step "
                    "cannot be given to one process")
    plan: dict = {"args": {}, "loaders": {}, "said": []}
    for i in drawn:
        x = loaders.get(i)
        if x is None:
            continue
        if x.get("custom_batches") or not x.get("batch"):
            return {}, (f"the DataLoader at {x['line']} takes a batch sampler of its own "
                        f"({x.get('sampler')}): the reference cannot give it the global batch")
        arg = x.get("arg")
        if arg:
            plan["args"][arg["dest"]] = nproc
            plan["said"].append(
                f"--reference: the reference ran with {arg['option']} {arg['value'] * nproc} = "
                f"{arg['value']} x {nproc} (the DataLoader at {x['line']} takes its batch size "
                "from it), as one process would for the same global batch")
        else:
            plan["loaders"][str(i)] = x["batch"] * nproc
            plan["said"].append(
                f"--reference: the reference's DataLoader at {x['line']} draws batches of "
                f"{x['batch'] * nproc} = {x['batch']} x {nproc} (its batch_size given so where "
                "the script does not compute it from the world size already)")
    return plan, ""


@dataclass(frozen=True)
class Reference:
    """What the reference run needs from watch_script: the script as watched, K steps, the
    folder both runs share (the tensors of the watched run's rank 0), the declared global batch."""

    script: str
    args: tuple
    nproc: int
    timeout: float
    steps: int
    folder: str
    global_batch: int | None = None
    argv0: str = ""  # the script's path as typed (sys.argv[0], as torchrun gives it)
    first: float | None = None  # the first step's allowance (steps.first_step_allowance)


def run_reference(job: Reference, ranks: list[dict], watched_seconds: float) -> dict:
    """The reference run (one process, K steps) after the watched one: what the check's judge
    reads as `ev.reference`. `job.global_batch`: the samples per optimizer step the job means,
    when declared (--global-batch G), judged against the ranks' batches."""
    script, args, nproc, steps, folder = job.script, job.args, job.nproc, job.steps, job.folder
    timeout = job.timeout
    out = {"steps": steps, "ranks": [], "seconds": {"watched": watched_seconds},
           "global_batch": job.global_batch}
    if nproc < 2:
        out["refused"] = "the run is one process already (--nproc-per-node 1)"
        return out
    plan, why = make_plan(ranks, nproc, steps)
    out["plan"] = plan
    if why:
        out["refused"] = why
        return out
    start = time.time()
    first = job.first or timeout
    run = launch(script_rank, script, list(args), folder, ("logged", "reference"),
                 job.argv0 or script, (float(timeout), first), world_size=1, timeout=first,
                 init_process_group=False, grace=2.0, as_torchrun=True,
                 env=env("reference", folder, steps, nproc, plan),
                 label=f"watch --reference {os.path.basename(script)}")
    out["seconds"]["reference"] = time.time() - start
    mine = read_records(os.path.join(folder, "rank0.jsonl"))
    out["ranks"] = [mine]
    done = len([s for s in mine.get("steps", []) if s.get("end")])
    err = mine.get("error") or {}
    failed = (f"{err['type']}: {err['message'][:200]}" + (f" ({err['line']})" if err.get("line") else "")
              if err else f"exit status {mine['exit']}" if mine.get("exit") else
              f"the run ended {run.status}" if run.status != "ok" else "")
    if failed and not done:
        out["refused"] = f"the script did not train a step at world size 1: {failed}"
    elif failed:
        out["error"] = failed
    elif not done:
        out["refused"] = "the script trained no optimizer step at world size 1"
    return out
