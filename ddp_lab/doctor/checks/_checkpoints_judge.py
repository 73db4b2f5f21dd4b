"""The checkpoints check's judges (checkpoints.py), in the parent: the ranks' records as
findings at the user's save or load line."""
from __future__ import annotations

from ._checkpoints_restores import judge_restores
from .api import Finding

WRAPPERS = (("module.", "DDP"), ("_orig_mod.", "torch.compile"))  # the prefixes they add


def _first(ev, key):
    """(rank, item) for each distinct (where, verdict) recorded under `key`, lowest rank first."""
    seen = {}
    for rank, rec in enumerate(ev.ranks):
        for item in rec.get(key, []) or []:
            seen.setdefault(item.get("where", ""), []).append((rank, item))
    return seen


def _reloaded_by_wrapper(ev, item) -> str:
    """Where the script itself loads the file into the wrapper that saved it ("" if nowhere)."""
    for rec in ev.ranks:
        for r in rec.get("reloaded", []) or []:
            if item.get("path") and r["path"] == item["path"] and r["into"] == "wrapper":
                return r["where"]
    return ""


def judge_saves(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "saved").items():
        bad = [(r, i) for r, i in items if not i.get("ok")
               and not (i.get("stripped_ok") and _reloaded_by_wrapper(ev, i))]
        if not bad:
            continue
        rank, item = bad[0]
        if "error" in item:
            evidence = [f"rank {rank} saved the {item['kind']} model's state to {item['file']}; "
                        f"loading it into a fresh plain model: {item['error']}"]
        else:
            evidence = [f"rank {rank}: {item['differs']} reloads off by {item['off']:.3g} from "
                        "the model's value when it was saved"]
        if item.get("how"):
            evidence.append(f"read back with {item['how']}")
        if item.get("saved_at") and item["saved_at"] != where:
            evidence.append(f"this state_dict() gives the keys; the file is written at {item['saved_at']}")
        if item.get("prefix"):
            by = [who for name, who in WRAPPERS if name in item["prefix"]]
            evidence.append(f"the saved keys start with {item['prefix']!r}"
                            + (f", added by {' and '.join(by)}" if by else ""))
        if item.get("stripped_ok"):
            evidence.append(f"with {item['prefix']!r} taken off, every key loads: the file holds "
                            "the model, but only the same wrapper reloads it as saved (not a "
                            "plain model for evaluation, another strategy or a single process)")
        if item.get("sharded"):
            evidence.append("the state holds DTensors: under FSDP2 model.state_dict() is this "
                            "rank's shard of each parameter, not the full value")
        out.append(Finding(
            "warning" if item.get("stripped_ok") else "error", "checkpoint-does-not-reload", "09",
            "the checkpoint the script saves does not reload into a plain model", evidence,
            fix="save the plain module's state: model.module.state_dict() under DDP, the "
                "module you passed to torch.compile (not its wrapper); under FSDP2 "
                "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                "cpu_offload=True)) on every rank, then save on rank 0",
            where=where))
    return out


WHEN = {"forward": "at the model's next forward", "wrapped": "when the script wrapped the model",
        "end": "when the script ended"}


def judge_dcp(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "dcp-saves").items():
        lost = [(r, i) for r, i in items if i.get("count")]
        if not lost:
            continue
        rank, item = lost[0]
        keys = ", ".join(f"{x['key']} (off by {x['off']:.3g})" for x in item["lost"][:3])
        out.append(Finding(
            "error", "dcp-values-lost", "16",
            "dcp.save kept one rank's value of a tensor that differs between ranks",
            [f"rank {rank} reads back other values than it saved: {keys}",
             "a plain tensor (not a DTensor) under the same key on every rank is taken as "
             "replicated: DCP's planner writes it once (torch/distributed/checkpoint/"
             "_dedup_save_plans.py:42-55, default_planner.py:135-143)"],
            fix="make a per-rank shard a DTensor (DTensor.from_local(shard, mesh, [Shard(0)])) "
                "so that DCP saves each rank's part, or give each rank's tensor its own key",
            where=where))
    for where, items in _first(ev, "dcp-loads").items():
        bad = [(r, i) for r, i in items if "differs" in i]
        if not bad:
            continue
        rank, item = bad[0]
        out.append(Finding(
            "error", "dcp-load-into-copy", "16",
            "dcp.load filled copies of the model's tensors: the model kept its old values",
            [f"rank {rank}: {item['keys'] - item['shared']} of {item['keys']} tensors dcp.load "
             "filled are not the model's own (no shared storage)",
             f"{WHEN.get(item['when'], item['when'])}, the model's {item['differs']} still "
             f"differed from the value dcp.load read by {item['off']:.3g}",
             "dcp.load loads in place into the tensors it is given "
             "(torch/distributed/checkpoint/filesystem.py:914 copies into the tensors it is "
             "given)"],
            fix="pass the model's own state (model.state_dict(), or the model itself as a "
                "Stateful), or call model.load_state_dict(state) after dcp.load",
            where=where))
    return out


def judge_loads(ev) -> list[Finding]:
    out = []
    for where, items in _first(ev, "loaded-nothing").items():
        rank, item = items[0]
        out.append(Finding(
            "error", "checkpoint-does-not-reload", "09",
            "load_state_dict(strict=False) loaded none of the model's tensors", [
                f"rank {rank}: {item['type']}.load_state_dict matched none of its "
                f"{item['missing']} keys; the state's keys were "
                + ", ".join(repr(k) for k in item["unexpected"])
                + (" ..." if item.get("unexpected_count", 0) > len(item["unexpected"]) else ""),
                "strict=False turns the key mismatch PyTorch would raise into a silent no-op: "
                "the model keeps the values it had"],
            fix="pass the model's own state dict (checkpoint['model'], without a 'module.' or "
                "'_orig_mod.' prefix) and load with strict=True, or check the returned "
                "missing_keys", where=where))
    return out


def judge(ev) -> list[Finding]:
    return judge_saves(ev) + judge_loads(ev) + judge_dcp(ev) + judge_restores(ev)
