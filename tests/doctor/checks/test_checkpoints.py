"""The checkpoints check (ddp_lab/doctor/checks/checkpoints.py): each code fails on a corpus
case's broken script and stays silent on its fixed one, each run under watch on 2 real ranks.

    checkpoint-does-not-reload  30 (DDP's "module." prefix: a warning), 31 (torch.compile's
                                "_orig_mod.": named at the state_dict() call that gives the keys),
                                32 (FSDP2 shards saved by rank 0), 35 (load_state_dict(strict=False)
                                loads nothing); a file the script reloads into the same DDP model,
                                or holding an object torch.load's default refuses, reloads as the
                                script's own load would
    dcp-values-lost             33 (a hand-sharded plain tensor under one key)
    dcp-load-into-copy          34 (dcp.load into CPU copies of the model's tensors)
    state-dict-by-reference     b52 (a "best" state kept as model.state_dict(), loaded back at the
                                end: named where it was taken; test_checkpoints_restores.py in-process)
    checkpoint-state-not-restored  b62 (an EMA restored on resume from the live model, its entry in
                                the checkpoint left unread: named at that load)
"""
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import corpus_score

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
CODES = ("checkpoint-does-not-reload", "dcp-values-lost", "dcp-load-into-copy",
         "state-dict-by-reference", "checkpoint-state-not-restored")
CASES = [  # a file only the same wrapper reloads is a warning; lost or unloaded values, errors
    ("30_ddp_module_prefix", "checkpoint-does-not-reload", "warning"),
    ("31_compiled_orig_mod_prefix", "checkpoint-does-not-reload", "warning"),  # state_dict()'s line
    ("32_fsdp2_rank0_saves_shards", "checkpoint-does-not-reload", "error"),
    ("35_strict_false_loads_nothing", "checkpoint-does-not-reload", "error"),
    ("33_dcp_dedup_per_rank_tensor", "dcp-values-lost", "error"),
    ("34_dcp_load_into_copy", "dcp-load-into-copy", "error"),
    ("b52_best_state_dict_reference", "state-dict-by-reference", "warning"),  # blind cases
    ("b62_resume_ema_from_live_weights", "checkpoint-state-not-restored", "warning")]


@lru_cache(maxsize=None)
def report(case: str, script: str):
    """watch as the corpus test runs the script (its run, shared), but never under --reference
    (b52 and b62 are of the reference's class: the corpus runs them with --reference-steps 3)."""
    score, path = corpus_score(), str(CORPUS / case / script)
    call = score.watch_call(path)
    return score.watch_run(path, tuple(call["args"]), call["nproc"], call["timeout"], None)


def fault_line(case: str) -> int:
    fault = tomllib.loads((CORPUS / case / "case.toml").read_text())["fault"]
    lines = (CORPUS / case / "broken.py").read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if fault in line]
    assert len(found) == 1, (case, fault, found)
    return found[0]


@pytest.mark.slow
@pytest.mark.parametrize("case,code,severity", CASES)
def test_broken_script_gets_the_code_at_its_line(case, code, severity):
    rep = report(case, "broken.py")
    hits = [f for f in rep.findings if f.code == code]
    assert hits, [(f.code, f.title) for f in rep.findings] + rep.notes
    f = hits[0]
    assert f.severity == severity
    assert f.where.startswith(f"broken.py:{fault_line(case)}: "), f.where
    assert tomllib.loads((CORPUS / case / "case.toml").read_text())["fault"] in f.where
    assert f.evidence and f.fix


@pytest.mark.slow
@pytest.mark.parametrize("case,code,severity", CASES)
def test_fixed_script_gets_none_of_the_codes(case, code, severity):
    rep = report(case, "fixed.py")
    assert rep.status == "ok", rep.notes
    mine = [(f.code, f.evidence) for f in rep.findings if f.code in CODES]
    assert not mine, mine
    assert not [n for n in rep.notes if "hook failed" in n], rep.notes


@pytest.mark.slow
def test_the_reload_error_is_pytorchs_own_message():
    f = next(f for f in report("30_ddp_module_prefix", "broken.py").findings
             if f.code == "checkpoint-does-not-reload")
    assert "Error(s) in loading state_dict for Net" in f.evidence[0]
    assert 'Unexpected key(s) in state_dict: "module.fc1.weight"' in f.evidence[0]
    assert any("every key loads" in e for e in f.evidence)  # the prefix is all that is wrong
    shards = next(f for f in report("32_fsdp2_rank0_saves_shards", "broken.py").findings
                  if f.code == "checkpoint-does-not-reload")
    assert "mixed torch.Tensor and DTensor" in shards.evidence[0]


# --- the state-dict matching, without ranks --------------------------------------------------

def test_match_finds_the_wrappers_prefix_and_rejects_other_state():
    from ddp_lab.doctor.checks.checkpoints import match

    keys = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert match(dict.fromkeys(keys), keys) == ""
    assert match({f"module.{k}": 0 for k in keys}, keys) == "module."
    assert match({f"_orig_mod.{k}": 0 for k in keys}, keys) == "_orig_mod."
    assert match({"state": 0, "param_groups": 0}, keys) is None  # an optimizer's state
    assert match({"fc1.weight": 0}, keys) is None  # a quarter of the model is not its state


def test_fresh_copy_is_a_new_plain_module_with_the_same_keys():
    import torch

    from ddp_lab.doctor.checks.checkpoints import fresh_copy

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    copy = fresh_copy(model)
    assert copy is not model and list(copy.state_dict()) == list(model.state_dict())
    copy[0].weight.data.zero_()
    assert model[0].weight.abs().sum() > 0  # not sharing storage with the live model


# --- scripts beyond the corpus: FSDP2 with DCP, an EMA copy saved --------------------------------

FSDP2_DCP = '''
import os, shutil, tempfile
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp, torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     set_model_state_dict)
from torch.distributed.fsdp import fully_shard


def make():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    fully_shard(m[0]); fully_shard(m[2]); fully_shard(m)
    return m


def main():
    dist.init_process_group("gloo")
    folder = os.path.join(tempfile.gettempdir(), "ckpt-" + os.environ["MASTER_PORT"])
    torch.manual_seed(0)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
    dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
    torch.manual_seed(1)
    new = make()
    opts = StateDictOptions(full_state_dict=True)
    state = {"model": get_model_state_dict(new, options=opts)}
    dcp.load(state, checkpoint_id=folder)
    SET
    opt = torch.optim.SGD(new.parameters(), lr=0.1)
    loss = new(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(folder, ignore_errors=True)
    dist.destroy_process_group()


main()
'''

EMA = '''
import copy, os, tempfile
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
ema = copy.deepcopy(model.module)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    loss = model(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.module.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
if dist.get_rank() == 0:
    with tempfile.TemporaryDirectory() as folder:
        torch.save({"ema": ema.state_dict(), "model": model.module.state_dict()},
                   os.path.join(folder, "ckpt.pt"))
dist.barrier()
dist.destroy_process_group()
'''


def watch_text(tmp_path, text):
    from ddp_lab.doctor.watch.script import watch_script

    path = tmp_path / "train.py"
    path.write_text(text)
    return watch_script(str(path), nproc=2, timeout=90, checks=["checkpoints"])


@pytest.mark.slow
def test_fsdp2_dcp_full_state_load_needs_set_model_state_dict(tmp_path):
    forgot = watch_text(tmp_path, FSDP2_DCP.replace("    SET\n", ""))
    f = next(f for f in forgot.findings if f.code == "dcp-load-into-copy")
    assert f.severity == "error" and f.where.startswith("train.py:") and "dcp.load(state" in f.where
    fixed = watch_text(tmp_path, FSDP2_DCP.replace(
        "SET", 'set_model_state_dict(new, state["model"], options=opts)'))
    assert fixed.status == "ok" and not fixed.findings, [f.code for f in fixed.findings]


@pytest.mark.slow
def test_an_ema_copy_saved_beside_the_model_is_no_finding(tmp_path):
    rep = watch_text(tmp_path, EMA)  # same keys, other values: a copy, not the model's state
    assert rep.status == "ok" and not rep.findings, [(f.code, f.evidence) for f in rep.findings]
    assert not [n for n in rep.notes if "hook failed" in n], rep.notes


# --- reloading as the script would (issue 44): its own torch.load, its own wrapper ------------

CONFIG = '''
import dataclasses, os, shutil, tempfile
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class Config:
    width: int = 8


dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()
box = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
dist.broadcast_object_list(box, src=0)
path = os.path.join(box[0], "ckpt.pt")
BEFORE
if dist.get_rank() == 0:
    torch.save({"model": STATE, "config": Config()}, path)
dist.barrier()
AFTER
dist.barrier()
if dist.get_rank() == 0:
    shutil.rmtree(box[0])
dist.destroy_process_group()
'''


def config_script(tmp_path, state, before="pass", after="pass"):
    return watch_text(tmp_path, CONFIG.replace("STATE", state).replace("BEFORE", before)
                      .replace("AFTER", after))


@pytest.mark.slow
def test_a_file_holding_an_object_is_reloaded_with_weights_only_false_and_says_so(tmp_path):
    plain = config_script(tmp_path, "model.module.state_dict()",
                          after='torch.load(path, weights_only=False)')
    assert plain.status == "ok" and not plain.findings, [(f.code, f.evidence) for f in plain.findings]
    saved = plain.evidence.ranks[0]["saved"][0]
    assert saved["ok"] and saved["how"].startswith("weights_only=False: torch.load's default refuses")
    prefixed = config_script(tmp_path, "model.state_dict()")  # still a finding: only DDP reloads it
    f = next(f for f in prefixed.findings if f.code == "checkpoint-does-not-reload")
    assert f.severity == "warning" and "read back with weights_only=False" in " ".join(f.evidence)


@pytest.mark.slow
def test_the_scripts_own_torch_load_arguments_are_the_ones_used(tmp_path):
    rep = config_script(tmp_path, "model.state_dict()", before=(
        'torch.save({"n": 1}, path + ".meta") if dist.get_rank() == 0 else None; dist.barrier(); '
        'torch.load(path + ".meta", weights_only=False)'))
    f = next(f for f in rep.findings if f.code == "checkpoint-does-not-reload")
    assert "weights_only=False, as the script's own torch.load (train.py:20" in " ".join(f.evidence)


@pytest.mark.slow
def test_a_ddp_state_loaded_back_into_the_ddp_model_is_no_finding(tmp_path):
    # pytorch/examples' DDP checkpoint: save ddp_model.state_dict(), load it into ddp_model
    rep = config_script(tmp_path, "model.state_dict()",
                        after='model.load_state_dict(torch.load(path, weights_only=False)["model"])')
    assert rep.status == "ok" and not rep.findings, [(f.code, f.evidence) for f in rep.findings]
    assert [r["into"] for r in rep.evidence.ranks[1]["reloaded"]] == ["wrapper"]
