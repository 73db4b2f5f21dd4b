"""The resume check's judges (resume.py), in the parent: a resumed optimizer that steps with
another scheduler position or loss scale than its checkpoint's writer had; a loaded state no
optimizer steps with; ranks that resume from different states."""
from __future__ import annotations

from .api import Finding

FIX_LOST = ("save the state of everything that steps with the optimizer beside its state "
            "(scheduler.state_dict(), scaler.state_dict()) and load each back with its "
            "load_state_dict when resuming")


def _saves(ev) -> list:
    """Every save, with its rank ("rank" added)."""
    return [dict(s, rank=r) for r, rec in enumerate(ev.ranks) for s in rec.get("resume-saves", []) or []]


def _held(saves: list, s: dict, part: dict) -> bool:
    """The part's state is in the save, or in another file the same rank wrote at the same step
    (one checkpoint as several files: transformers' optimizer.pt, scheduler.pt, scaler.pt)."""
    if part["held"]:
        return True
    key = "pos" if part["what"] == "scheduler" else "scale"
    return any(o["rank"] == s["rank"] and o["step"] == s["step"] and x["what"] == part["what"]
               and x[key] == part[key] for o in saves for x in o.get("states", []))


def _writer(saves: list, c: dict) -> dict | None:
    """The last save of the file `c` loaded, before it loaded it."""
    before = [s for s in saves if s.get("file") and s["file"] == c.get("file") and s["at"] <= c["at"]
              and s["parts"] is not None and s["optimizers"]]
    return max(before, key=lambda s: s["at"]) if before else None


def _same_lr(a: list, b: list) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-6 * max(1.0, abs(x)) for x, y in zip(a, b))


def _lost(part: dict, now: list) -> tuple | None:
    """(what the writer had, what the resumed run has) when they differ, else None."""
    if part["what"] == "scheduler":
        same = [s for s in now["schedulers"] if s["cls"] == part["cls"]]
        if not same or any(s["pos"] == part["pos"] or _same_lr(s["lr"], part["lr"]) for s in same):
            return None
        s = same[-1]
        return (f"step {part['pos']} of its schedule (lr {part['lr'][0]:.4g})",
                f"step {s['pos']} (lr {s['lr'][0]:.4g})", s["line"])
    same = [s for s in now["scalers"] if s["cls"] == part["cls"]]
    if not same or any(s["scale"] == part["scale"] for s in same):
        return None
    return f"loss scale {part['scale']:g}", f"loss scale {same[-1]['scale']:g}", same[-1]["line"]


def judge_lost(ev) -> list[Finding]:
    saves, out, resumed = _saves(ev), {}, set()
    for rank, rec in enumerate(ev.ranks):
        for c in rec.get("resume-continues", []) or []:
            s = _writer(saves, c)
            if s is None:
                found = _not_loaded(rank, c)  # written by another run: what the file holds
                if found is not None:
                    out.setdefault(c["where"], found)
                continue
            resumed.add(s["where"])  # this line's checkpoints are resumed from: judged so
            for part in s["parts"]:
                lost = _lost(part, c)
                if lost is None:
                    continue
                part = dict(part, held=_held(saves, s, part))
                where = c["where"] if part["held"] else s["where"]
                out.setdefault(where, _lost_finding(rank, part, lost, s, c, where))
    notes = {}
    for s in saves:
        missing = [p for p in s["parts"] if not _held(saves, s, p)]
        if missing and s["where"] not in resumed and s["where"] not in out:
            notes.setdefault(s["where"], _not_saved(s, missing))
    return list(out.values()) + list(notes.values())


def _not_loaded(rank: int, c: dict) -> Finding | None:
    """The file the optimizer's state came from holds a scheduler's (scaler's) state, and none
    of the resumed run's stands where it says."""
    for what, key, live in (("scheduler", "pos", c["schedulers"]), ("scaler", "scale", c["scalers"])):
        held = [h[key] for h in c.get("held", []) if h["what"] == what]
        if not held or not live or any(x[key] in held for x in live):
            continue
        name = live[0]["cls"] if what == "scheduler" else "GradScaler"
        had = (f"step {held[0]} of its schedule" if what == "scheduler" else f"loss scale {held[0]:g}")
        has = (f"step {live[0]['pos']}" if what == "scheduler" else f"loss scale {live[0]['scale']:g}")
        return Finding(
            "warning", "resume-state-lost", "17",
            f"the resume does not load the {name}'s state the checkpoint holds",
            [f"the checkpoint rank {rank} resumed from ({c['where']}) holds a {what} state at {had}",
             f"the resumed run's {name} (built at {live[0]['line']}) stands at {has}: it starts over"],
            fix=FIX_LOST, where=c["where"])
    return None


def _lost_finding(rank, part, lost, s, c, where) -> Finding:
    had, has, built = lost
    what = "GradScaler" if part["what"] == "scaler" else part["cls"]
    evidence = [f"when the checkpoint was written ({s['where']}), its {what} stood at {had}",
                f"rank {rank} resumed from it ({c['where']}) with a {what} at {has}"
                + (f" (built at {built})" if built else "")]
    if part["held"]:
        evidence.append(f"the checkpoint holds the {what}'s state: the resume never loads it back")
        title = f"the resume does not load the {what}'s state the checkpoint holds"
    else:
        evidence.append(f"the checkpoint holds the optimizer's state but not the {what}'s"
                        + (": the schedule starts over (a warm-up runs again)" if part["what"] ==
                           "scheduler" else ": the scale starts over, and the first steps "
                           "overflow and are skipped until it backs off again"))
        title = f"a checkpoint holds the optimizer's state but not its {what}'s: a resume restarts it"
    return Finding("warning", "resume-state-lost", "17", title, evidence, fix=FIX_LOST, where=where)


def _not_saved(s: dict, missing: list) -> Finding:
    names = ", ".join(dict.fromkeys("GradScaler" if p["what"] == "scaler" else p["cls"] for p in missing))
    return Finding(
        "info", "resume-state-not-saved", "17",
        f"a checkpoint holds the optimizer's state but not the {names}'s",
        [f"live when it was written: {names}, stepping with the optimizer whose state it holds",
         "this run never resumed from it: a resume that rebuilds them starts them over unless "
         "the script restores their position itself"],
        fix=FIX_LOST, where=s["where"])


def parting(loaded: list, stepping: list) -> tuple[str, str]:
    """(the loaded optimizer's line, the stepping one's) where their constructions depart (the
    user's frames compared from the outermost in): the line that built the one that steps."""
    for a, b in zip(reversed(loaded), reversed(stepping)):
        if a != b:
            return a, b
    return (loaded[0] if loaded else ""), (stepping[0] if stepping else "")


def judge_unused(ev) -> list[Finding]:
    out = {}
    for rank, rec in enumerate(ev.ranks):
        for u in rec.get("resume-unused", []) or []:
            built, where = parting(u["loaded"], u["stepping"])
            out.setdefault(where, Finding(
                "warning", "loaded-state-not-used", "17",
                "the optimizer that loaded the checkpoint's state is not the one that steps",
                [f"rank {rank}: the optimizer built at {built or 'an unknown line'} loaded the "
                 f"checkpoint's state ({u['load']}) and never stepped",
                 f"the optimizer built at {where} steps the same parameters from step "
                 f"{u['step']}, with a fresh state (moments and step counts from zero)"],
                fix="build the optimizer once (around the model that trains: DDP's parameters are "
                    "the module's) and load the checkpoint's state into that one",
                where=where))
    return list(out.values())


def _folder_line(ev, rank: int, path: str) -> str:
    """The line that made the folder `path` lies in on `rank`, when the same line made another
    folder on another rank (tempfile.mkdtemp names a new one in each process)."""
    import os

    for f in ev.ranks[rank].get("resume-folders", []) or []:
        if not path.startswith(f["path"].rstrip(os.sep) + os.sep):
            continue
        others = [g["path"] for r, rec in enumerate(ev.ranks) if r != rank
                  for g in rec.get("resume-folders", []) or [] if g["line"] == f["line"]]
        if others and all(p != f["path"] for p in others):
            return f["line"]
    return ""


def judge_differ(ev) -> list[Finding]:
    starts = [{s["i"]: s for s in rec.get("resume-starts", []) or []} for rec in ev.ranks]
    out = []
    for i in sorted(set.intersection(*(set(s) for s in starts)) if starts else ()):
        rows = [s[i] for s in starts]
        if len({(r["model"], r["optimizer"]) for r in rows}) < 2 or len({r.get("names") for r in rows}) > 1:
            continue  # the same state, or not the same parameters (a sharded optimizer)
        step = rows[0]["step"]
        reads = {r: [x for x in rec.get("resume-reads", []) or [] if x["step"] == step]
                 for r, rec in enumerate(ev.ranks)}
        readers = [r for r, xs in reads.items() if xs]
        if not readers:
            continue  # no resume: the state check judges parameters that part
        first = reads[readers[0]][0]
        folder = _folder_line(ev, readers[0], first["file"])
        parted = [name for name in ("model", "optimizer") if len({r[name] for r in rows}) > 1]
        others = [r for r in reads if r not in readers]
        evidence = [f"at the first step of the optimizer built at {rows[0]['line']} (step {step}), "
                    f"the ranks' {' and '.join('parameters' if p == 'model' else 'optimizer state' for p in parted)} "
                    "differ",
                    f"rank(s) {', '.join(map(str, readers))} read a checkpoint before it "
                    f"({first['where']})" + (f"; rank(s) {', '.join(map(str, others))} read none"
                                             if others else ", each another state")]
        if folder:
            evidence.append(f"the checkpoint lies in the folder made at {folder}: each rank made "
                            "its own there (tempfile.mkdtemp names a new folder in each process), "
                            "so no other rank sees the checkpoints one rank writes")
        out.append(Finding(
            "error", "ranks-resume-differently", "17",
            "the ranks resume from different states", evidence,
            fix="give every rank the same checkpoint path (make the folder on rank 0 and "
                "broadcast it, or use a fixed shared folder) and load it on every rank before "
                "training resumes",
            where=folder or first["where"]))
    return out


def judge(ev) -> list[Finding]:
    return judge_lost(ev) + judge_unused(ev) + judge_differ(ev)
