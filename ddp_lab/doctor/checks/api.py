"""The types a check works with, in one place: what a check module imports (with the user's line,
ddp_lab/doctor/userline.py), and nothing of the tools above it.

    from .api import Check, Finding

    def attach(ctx: Context): ...     # watch, on each rank before the user's code runs
    def judge(ev: Evidence) -> list[Finding]: ...   # in the parent, for every tool it serves
    CHECK = Check(name="mine", mechanism="...", lesson="07", codes={"my-code": "warning"},
                  attach=attach, judge=judge, tools=("watch",), tests="tests/doctor/checks/test_mine.py")

- `Check`: a check's declaration (the registry, checks/__init__.py, finds it by its module).
- `Context` (context.py): one rank's view of a watched run: the rank, the step, `models`
  (the `Watched` models the script wrapped), `add`/`emit` (plain data the parent reads back;
  `add(key, item, later=True)` for a record of every step: written with the step's end),
  the callbacks (`on_step_end`, `on_model`, `on_finish`, `on_torch_function` and, for a check
  that watches for a while, `off_torch_function`), `user_line()` and
  `guard(fn)` (a check's own exception is recorded, never raised into the user's code).
- `Evidence`: what a judge reads in the parent: `ranks` (per rank, {key: value}: RANK_KEYS
  below for watch; a phase's records and returned value for the doctor), `run` (the launch's
  RunResult; None under torchrun), and for the doctor `subject` (the `Subject` it examined) and
  `where` (the code map that names code shipped by value).
- `Subject`: the doctor's subject, frozen: what the user asked the doctor to examine.
- `Finding`, `Report` (report.py), `brief` (a long message cut), `digest` (a tensor's hash),
  `in_place_functions()` and `written_by(func, args, kwargs)` (what writes a tensor in place,
  for `on_torch_function`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..report import Finding, Report, brief
from ._context_writes import in_place_functions, written_by
from .context import KEEP, Context, Watched, class_name

__all__ = ["Check", "Context", "Evidence", "Finding", "KEEP", "MODEL_CHANGES", "RANK_KEYS",
           "Report", "Subject", "TIMED_OUT", "TOOLS", "Watched", "brief", "class_name", "digest",
           "in_place_functions", "written_by"]
TOOLS = ("watch", "doctor")
LEVELS = ("error", "warning", "info")
MODEL_CHANGES = "model-changes"  # the wrapped check's record, which the state check reads too
# a collective that timed out, as gloo and the script's own process-group timeout say it: a hang,
# never a root cause (the collectives and raised checks)
TIMED_OUT = re.compile(r"Timed out waiting|timed out|Timeout", re.I)


@dataclass(frozen=True)
class Check:
    """A check's declaration. `judge` is required; `attach` is watch's rank side (the doctor's
    checks are fed by the doctor's own phases, which record on the ranks). Checks are judged in
    the registry's order (by name): a judge sees the ranks' records, not other checks'
    findings; the report sorts findings by severity, lesson and code."""

    name: str  # the module's name
    mechanism: str  # one line: what it judges (the docs' table of checks)
    lesson: str  # the lesson that teaches the error class
    codes: dict  # finding code -> the most severe level it is given at
    judge: Callable  # judge(evidence) -> list[Finding]
    attach: Callable | None = None  # attach(ctx) on each rank of a watched run
    tools: tuple = ("watch",)
    # the strategies whose rule its findings are (the report's strategy filter, strategies.py's
    # judged_under, and the "(DDP only)" beside a finding); None: every strategy's, or per code
    # as strategies.STRATEGIES_OF says; a finding that names its own keeps them
    strategies: tuple | None = None
    tests: str | tuple = ""  # the test file(s) holding its failing and passing tests
    notes: tuple = field(default=())  # what it does not see (the docs' table of checks)

    def __post_init__(self):
        bad = [t for t in self.tools if t not in TOOLS]
        if bad:
            raise ValueError(f"check {self.name}: tools must be among {TOOLS}, got {bad}")
        if not self.codes or any(v not in LEVELS for v in self.codes.values()):
            raise ValueError(f"check {self.name}: codes must map each code to one of {sorted(LEVELS)}")


@dataclass(frozen=True)
class Subject:
    """What the doctor examines, as the user gave it (validated): one object every phase of the
    doctor takes (`phase(subject) -> (run, findings)`) and every doctor check reads
    (`ev.subject`). It travels to the ranks whole (the launcher pickles it)."""

    source: Any  # exam/inputs.ModelSource: .build() gives a fresh instance, .name the user's
    example: Any  # a tensor, a tuple of forward's arguments, a dict of them, or rank -> batch
    world_size: int = 2
    steps: int = 3
    loss: Any = None  # exam/inputs.Loss: the user's loss_fn, or the default
    amp: str | None = None  # "bf16", "fp16" or None
    ddp_kwargs: dict = field(default_factory=dict)  # the user's DDP settings, validated
    strategy: str = "ddp"  # "ddp", "fsdp2", "zero3" or "tp"
    plan: dict | None = None  # exam/shapes.plan: the length odd ranks are cut to, or None
    tp_plan: Any = None  # the user's tensor-parallel plan, "traced", or None
    parallelize: Callable | None = None  # the user's own split, fn(model, mesh)
    compile: dict | None = None  # exam/compile_run.settings_of: the torch.compile settings
    timeout: float = 60
    where: dict = field(default_factory=dict)  # userline.code_map of the module (+ parallelize)
    ranges: dict = field(default_factory=dict)  # userline.code_ranges: its Python modules' functions


# What `ev.ranks[r]` holds in a watched run (Context.add: a list, KEEP items at most; emit: one
# value), key by key, and who writes it. A check adds keys of its own, named after it.
RANK_KEYS = {
    # the core (watch/core.py), on every rank
    "script": "emit: the script's file name",
    "started": "emit: True once the script (or train_step) started running",
    "group": "emit: {backend, line}: the process group the script started, and where",
    "group_started": "emit: whether it ever started one",
    "models": "add: {kind: ddp|fsdp2|compiled, type: the user's class, line: where wrapped}",
    "compile-settings": "add: {line, <torch.compile's keyword arguments as repr>}",
    "error": "emit: {type, message, line, traceback, step, at}: the exception the script raised",
    "exit": "emit: the script's exit status (0 when it returned)",
    "hung": "emit (torchrun): {step, after, line, stack, at}: a step that never ended",
    "lost": "under torchrun: True for a rank that never handed its records over",
    "check-errors": "add: 'check: Type: message' for a check's own failure (never raised)",
    "steps": "[{begin, end}] per step (a step ends when an optimizer's step() returns)",
    "step-hooks": "emit (watch's per-step clock): {steps, seconds, max, timeout, first}: the "
                  "step-end hooks' time, the per-step timeout and the first step's allowance",
    # the checks' own (see each check's module)
    "collective-calls": "collectives: {op, step, line, shape, stack} per collective called",
    "step-line": "collectives: [file, line] of the user's frame at the first step's end",
    "collective-reads": "collectives: {route: async|off-root, op, made, made_step, dst, read, how, "
                        "step}: the first read of a result a collective left undefined",
    "collective-broadcasts": "collectives: {line, stack, step, src, op, open, v} per broadcast "
                             "of a few numbers the script called itself",
    "collective-grads": "collectives: {line, step, op, model, names, params, before, after, end} "
                        "per line and step that all_reduced gradients DDP had averaged",
    "collective-aliases": "collectives: {op, line, step, pairs, n, made} per line whose "
                          "collective's output list shares memory between entries",
    "state": "state: {step, parameter: {name: digest}, buffer: {...}, sharded} per hashed step",
    "collective-discarded": "collectives: {op, line, step} per line whose in-place collective "
                            "wrote into a copy nothing kept",
    "state-edits": "state: edits of parameters or buffers outside the optimizer, per line",
    "state-built": "state: {name: line} where the script built the module of a parameter that an "
                   "optimizer steps and no wrapped model holds",
    "state-models": "state: {kind, line, sync_buffers} per wrapped model",
    "state-cost": "state: {steps_hashed, seconds}",
    "state-start": "state: {step, parameter: {name: digest}}: parameters no wrapped model holds, "
                   "before their optimizer's first step",
    "state-unsynced": "state: {step, line, why, flag?}: a step whose last backward DDP did not prepare",
    "state-grad-reads": "state: {step, line, digest}: a norm of the optimizers' gradients, at hashed steps",
    "sanity.loss": "sanity: {s, v, line}: the first non-finite loss a backward started from",
    "sanity.params": "sanity: {s, when, names, tensors, values, of, finite_until}: the first non-finite "
                     "parameters",
    "sanity.uninitialised": "sanity: {s, line, names, count, of, before, after, missing_before?}: "
                            "tensors to_empty left unwritten at the first step",
    "sanity.summary": "sanity: {losses, non_finite_losses, finite_until} at the end",
    "model-changes": "wrapped: {what, names, kind, line, wrapped_at, step} per change",
    "requires-grad-frozen": "wrapped: {what, names, kind, line, wrapped_at, step} per freeze "
                            "after DDP(...) that DDP does not handle (find_unused_parameters off)",
    "samples": "samples: per DataLoader: {line, dataset, sampler, epochs}",
    "samples-refused": "samples: {line, type, message}: DataLoader.__init__ raised",
    "saved": "checkpoints: {where, saved_at, file, path, kind, prefix, how, ok | error | differs}",
    "reloaded": "checkpoints: {path, where, into: wrapper|module} per strict load_state_dict of a file",
    "samples-rows": "samples: {line, segments: [{tag, group, step, n, rows}]}: a hash per row of "
                    "the first input of a data-parallel model's training forward, per DataLoader "
                    "epoch or step",
    "loaded-nothing": "checkpoints: load_state_dict(strict=False) that matched nothing",
    "restores": "checkpoints: {kind: itself|live, where, s, type, ...} a load_state_dict of the module's own "
                "earlier state, or of a live module's over a checkpoint entry nothing loads",
    "dcp-saves": "checkpoints: {where, lost, count} per dcp.save",
    "dcp-loads": "checkpoints: {where, when, keys, shared, ok | differs} per dcp.load",
    "dcp-unread": "checkpoints: {where, why}: a dcp.save read back failed",
    "logged.train": "logged: {s, fn, v, grad, red, n} per loss; {s, fn, v, pure, by} per "
                    "backward (pure: the last loss scaled by numbers; by: [{line, ws}] where)",
    "logged.wrappers": "emit (logged): [{kind, avg}]: the ranks each model's gradients average",
    "logged.padding": "logged: {s, line, at, fn, pad, rows, v, real} per reduction over padding",
    "logged.value": "logged: {s, v, line} per number a logging line shows",
    "logged.norm": "logged: {s, v, shard, replicated} per gradient norm",
    "logged.reduce": "logged: {s, i, op, before, after, rows, line} per all_reduce",
    "compiles": "compiled: one record per frame dynamo compiled",
    "compile-breaks": "compiled: {step, reason, explain, where} per graph break",
    "compile-sites": "compiled: {assign, keyword, hooks}: lines of the script's source",
    "resume-saves": "resume: {where, file, at, step, optimizers, parts: [{what, cls, line, held, "
                    "pos, lr | scale}]} per torch.save holding an optimizer's state",
    "resume-continues": "resume: {ord, step, file, where, at, schedulers, scalers, held} at an "
                        "optimizer's first step after it loaded a state",
    "resume-starts": "resume: {i, ord, step, line, model, optimizer, n} digests at each "
                     "optimizer's first step (a DDP model's parameters)",
    "resume-unused": "resume: {loaded, load, stepping, step}: a loaded optimizer another one replaced",
    "resume-reads": "resume: {where, file, step} per torch.load from the user's code",
    "resume-folders": "resume: {line, path} per tempfile.mkdtemp from the user's code",
    "schedules": "schedule: {cls, length, of, line, length_line, pos, lr, resumed, member} per LR "
                 "scheduler whose length is known, at its death or the script's end",
    "compile-ran": "compiled: per callable torch.compile returned, the [first, last] step ranges "
                   "it ran in",
    "ddp-settings": "ddp_settings: {line, keyword, static_graph, world, steps, unused_steps, "
                    "first_unused, logging} per DDP model built with find_unused_parameters=True",
    "state-modes": "state: per wrapped model, [step, mask (1 train, 2 eval), line of the last "
                   "train()/eval()] when a step's training-forward mode changes",
    "ddp-accum": "ddp_settings: {line, where, steps, synced_steps, wasted_steps, wasted, first, backward_only, "
                 "static_graph, skipped, comm_hook} per DDP model: backwards accumulating onto "
                 "gradients DDP had already all-reduced in the same step",
    "optimizer.made": "optimizer: {o, line, type} per optimizer built (o: its index on the rank)",
    "optimizer.hyper": "optimizer: {o, k, s, v: per group [[key, value]], by: [{line, what}], "
                       "stores?, shared?} at its first step and when its hyperparameters change",
    "optimizer.idle": "optimizer: {o, line, s, at, params, elsewhere}: its 2nd step with no gradient",
    "optimizer.stale": "optimizer: {o, k, s, line, built}: a step on gradients holding the last step's",
    "optimizer.summary": "optimizer: [{o, line, k, chain, changes, v, live, idle}] at the end",
    # the reference check's, only under --reference (both runs: the watched ranks and the reference)
    "reference.loaders": "reference: {i, line, batch, custom_batches, drop_last, sampler, iterable, "
                         "arg: {dest, option, value, guessed} | None} per DataLoader made",
    "reference.batches": "reference: {s, i, n, rows: [crc32 per row]} per batch drawn in the compared steps",
    "reference.scaled": "reference (the reference run): {dest, option, from, to} per argument "
                        "scaled; {i, from, to, line, patched} per DataLoader given the global batch",
    "reference.optimizers": "reference: {kind: optimizer|scheduler, type, line, s, lrs, lr_line}",
    "reference.grad-reduce": "reference: {s, param, op, line}: the script's all_reduce of a .grad",
    "reference.dropout": "reference: {s, n}: dropout calls switched off in a compared step",
    "reference.precision": "reference: {s, dtype}: autocast's precision in a compared step",
    "reference.random": "reference: {s, fn, line}: a random draw of the step after its batch",
    "reference.model": "reference: {kind, type, line, numel, batchnorm, dtype} of the compared "
                       "model; {compiled_dropout} for a compiled one with dropout",
    "reference.init": "emit (the reference run): {loaded, differed}: rank 0's initial state loaded",
    "reference.compare": "reference (the reference run): {s, t: [[name, grad rel, grad ratio, "
                         "update rel, update ratio]], lr: [theirs, mine], bn, init} per step",
    "reference.lines": "reference (the reference run): {s, where, name, shape, reference, why, "
                       "apart, rel}: the first line whose batch-shaped tensor parts",
}


class Evidence:
    """What a check's `judge` reads: `ranks` (per rank, {key: value}), `run` (the launch's
    RunResult; None under torchrun), the script and the world size; for the doctor's checks
    `subject` (the Subject examined) and `where` (code ranges that name code shipped by value)."""

    def __init__(self, ranks: list[dict], run=None, script: str = "", world_size: int = 0,
                 args: tuple = (), subject: Subject | None = None, where: dict | None = None):
        self.ranks = ranks
        self.run = run
        self.script = script
        self.args = tuple(args)
        self.world_size = world_size or len(ranks)
        self.subject = subject
        self.where = where if where is not None else (subject.where if subject else {})

    def steps(self, rank: int) -> list[dict]:
        return self.ranks[rank].get("steps", []) if rank < len(self.ranks) else []

    def step_at(self, rank: int, when: float) -> int | None:
        """The step rank `rank` was in at wall-clock time `when`."""
        found = None
        for i, s in enumerate(self.steps(rank)):
            if s.get("begin") is not None and s["begin"] <= when:
                found = i
        return found

    @staticmethod
    def same(values, rel: float = 1e-5) -> bool:
        values = list(values)
        if not values:
            return True
        ref = values[0]
        return all(abs(v - ref) <= rel * max(1.0, abs(ref)) for v in values)


def digest(t) -> str:
    """A hash of a tensor's local values (a DTensor's shard): a CPU crc32 of its bytes;
    elsewhere torch.hash_tensor, an xor of the values, computed where the tensor is. Equal on
    two ranks when the values are."""
    import zlib

    import torch

    local = t.to_local() if hasattr(t, "to_local") else t
    data = local.detach()
    if data.numel() == 0:
        return "empty"
    if data.device.type == "cpu":
        raw = data.contiguous().reshape(-1).view(torch.uint8).numpy()
        return f"{zlib.crc32(memoryview(raw)):08x}"
    return f"{int(torch.hash_tensor(data)):016x}"
