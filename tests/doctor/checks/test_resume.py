"""The resume check (ddp_lab/doctor/checks/resume.py): a resumed run continues the run it
resumes. Each code fails on a blind corpus case's broken script at its fault line and stays
silent on the fixed one (2 real ranks under watch), and on scripts written here:

    resume-state-lost         b20 (an LR scheduler not in the checkpoint: the warm-up restarts),
                              b21 (a GradScaler not in it: the loss scale restarts); a
                              checkpoint that holds the scheduler the resume never loads back
                              (written in the same run, or by an earlier one)
    resume-state-not-saved    a checkpoint without the live scheduler, never resumed from (info)
    loaded-state-not-used     b23 (the optimizer that loaded the state is replaced by a new one)
    ranks-resume-differently  b24 (each rank's own tempfile.mkdtemp(): rank 1 finds nothing)
"""
import tomllib
from pathlib import Path

import pytest
from conftest import corpus_report

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
CODES = ("resume-state-lost", "resume-state-not-saved", "loaded-state-not-used",
         "ranks-resume-differently")
CASES = [("b20_resume_warmup_restarts", "resume-state-lost", "warning", "LambdaLR"),
         ("b21_resume_loss_scale_reset", "resume-state-lost", "warning", "loss scale 16384"),
         ("b23_resume_optimizer_rebuilt", "loaded-state-not-used", "warning", "fresh state"),
         ("b24_resume_rank_local_checkpoint", "ranks-resume-differently", "error", "mkdtemp")]


def fault_line(case: str) -> tuple[int, str]:
    fault = tomllib.loads((CORPUS / case / "case.toml").read_text())["fault"]
    lines = (CORPUS / case / "broken.py").read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if fault in line]
    assert len(found) == 1, (case, fault, found)
    return found[0], fault


@pytest.mark.slow
@pytest.mark.parametrize("case,code,severity,said", CASES)
def test_broken_script_gets_the_code_at_its_fault_line(case, code, severity, said):
    rep = corpus_report(CORPUS / case / "broken.py")
    hits = [f for f in rep.findings if f.code == code]
    assert len(hits) == 1, [(f.code, f.where) for f in rep.findings]
    f = hits[0]
    line, fault = fault_line(case)
    assert f.severity == severity and f.lesson == "17"
    assert f.where.startswith(f"broken.py:{line}: ") and fault in f.where, f.where
    assert any(said in e for e in f.evidence), f.evidence
    assert f.fix


@pytest.mark.slow
@pytest.mark.parametrize("case,code,severity,said", CASES)
def test_fixed_script_gets_none_of_the_codes(case, code, severity, said):
    rep = corpus_report(CORPUS / case / "fixed.py")
    assert rep.status == "ok", rep.notes
    assert [(f.code, f.evidence) for f in rep.findings if f.code in CODES] == []
    assert all(not r.get("check-errors") for r in rep.evidence.ranks), \
        [r.get("check-errors") for r in rep.evidence.ranks]


# --- scripts written here: what the checkpoint holds, and what the resume loads back ----------

SCRIPT = '''
import os, shutil, tempfile
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def job(path, steps):
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = BUILD
    if os.path.exists(path):
        ckpt = torch.load(path)
        opt.load_state_dict(ckpt["opt"])
        RESTORE
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    if dist.get_rank() == 0:
        torch.save({"opt": opt.state_dict(), SAVED"step": sched.last_epoch}, path)
    dist.barrier()


def main():
    dist.init_process_group("gloo")
    box = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    path = os.path.join(box[0], "ckpt.pt")
    job(path, 3)
    RESUME
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0])
    dist.destroy_process_group()


main()
'''
COSINE = "torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)"


def watch_text(tmp_path, build=COSINE, restore="pass", saved="", resume="job(path, 3)"):
    from ddp_lab.doctor.watch.script import watch_script

    text = (SCRIPT.replace("BUILD", build).replace("RESTORE", restore).replace("SAVED", saved)
            .replace("RESUME", resume))
    (tmp_path / "train.py").write_text(text)
    return watch_script(str(tmp_path / "train.py"), nproc=2, timeout=90, checks=["resume"])


def codes(rep) -> list:
    assert all(not r.get("check-errors") for r in rep.evidence.ranks)
    return sorted((f.code, f.severity, f.where.split(": ")[0]) for f in rep.findings)


@pytest.mark.slow
def test_a_checkpoint_that_holds_the_scheduler_the_resume_never_loads_names_the_load(tmp_path):
    rep = watch_text(tmp_path, saved='"sched": sched.state_dict(), ')
    assert codes(rep) == [("resume-state-lost", "warning", "train.py:14")]  # opt.load_state_dict
    f = rep.findings[0]
    assert "never loads it back" in " ".join(f.evidence) and "step 3" in f.evidence[0]


@pytest.mark.slow
def test_a_scheduler_restored_by_its_own_means_is_no_finding(tmp_path):
    # the checkpoint lacks the scheduler, but the resume rebuilds it at its position (last_epoch)
    rep = watch_text(tmp_path, restore='sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, '
                                       'last_epoch=ckpt["step"] - 1)')
    assert codes(rep) == [], [(f.code, f.evidence) for f in rep.findings]


@pytest.mark.slow
def test_a_checkpoint_never_resumed_from_is_a_note(tmp_path):
    rep = watch_text(tmp_path, resume="pass")
    assert codes(rep) == [("resume-state-not-saved", "info", "train.py:20")]
    assert "CosineAnnealingLR" in rep.findings[0].title


# --- the judges' rules, without ranks ---------------------------------------------------------

def test_the_stepping_optimizer_is_named_where_its_construction_departs():
    from ddp_lab.doctor.checks._resume_judge import parting

    loaded = ["t.py:3: return AdamW(p)", "t.py:10: opt = make(model)", "t.py:20: run()"]
    stepping = ["t.py:3: return AdamW(p)", "t.py:12: opt = make(ddp)", "t.py:20: run()"]
    assert parting(loaded, stepping) == ("t.py:10: opt = make(model)", "t.py:12: opt = make(ddp)")
    assert parting(loaded, loaded) == (loaded[0], loaded[0])  # built twice on one line


def test_an_optimizers_saved_state_is_recognised_as_its_own():
    import torch

    from ddp_lab.doctor.checks._resume_saved import holds_optimizer, is_optimizer_state

    p = torch.nn.Parameter(torch.ones(2))
    a, b = torch.optim.Adam([p], lr=0.1), torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(2)
    a.step()
    saved = a.state_dict()
    assert is_optimizer_state(saved) and not is_optimizer_state({"state": {}})
    assert holds_optimizer([saved], a) and not holds_optimizer([saved], b)  # b has no state yet
    assert holds_optimizer([b.state_dict()], b)  # no state: the same groups and lr


def test_a_scheduler_that_restarted_is_told_from_one_that_continued():
    from ddp_lab.doctor.checks._resume_judge import _lost

    part = {"what": "scheduler", "cls": "LambdaLR", "pos": 4, "lr": [0.0375]}
    restarted = {"schedulers": [{"cls": "LambdaLR", "pos": 0, "lr": [0.025], "line": ""}]}
    continued = {"schedulers": [{"cls": "LambdaLR", "pos": 4, "lr": [0.0375], "line": ""}]}
    constant = {"schedulers": [{"cls": "LambdaLR", "pos": 0, "lr": [0.0375], "line": ""}]}
    assert _lost(part, restarted)[:2] == ("step 4 of its schedule (lr 0.0375)", "step 0 (lr 0.025)")
    assert _lost(part, continued) is None and _lost(part, constant) is None
    scaler = {"what": "scaler", "cls": "GradScaler", "scale": 16384.0}
    assert _lost(scaler, {"scalers": [{"cls": "GradScaler", "scale": 65536.0, "line": ""}]})
    assert _lost(scaler, {"scalers": [{"cls": "GradScaler", "scale": 16384.0, "line": ""}]}) is None


@pytest.mark.slow
def test_a_scheduler_saved_in_a_file_of_its_own_at_the_same_step_is_held(tmp_path):
    # one checkpoint as several files, as transformers' Trainer writes optimizer.pt, scheduler.pt
    rep = watch_text(tmp_path, resume="pass", saved="")  # baseline: the note
    assert [f.code for f in rep.findings] == ["resume-state-not-saved"]
    split = SCRIPT.replace('torch.save({"opt"', 'torch.save(sched.state_dict(), path + ".s"); torch.save({"opt"')
    (tmp_path / "train.py").write_text(split.replace("BUILD", COSINE).replace("RESTORE", "pass")
                                       .replace("SAVED", "").replace("RESUME", "pass"))
    from ddp_lab.doctor.watch.script import watch_script

    rep = watch_script(str(tmp_path / "train.py"), nproc=2, timeout=90, checks=["resume"])
    assert codes(rep) == [], [(f.code, f.evidence) for f in rep.findings]


def starts(model: str, names: str = "n0", step: int = 4) -> dict:
    return {"i": 1, "ord": 1, "step": step, "line": "t.py:9: opt = SGD(p)", "model": model,
            "optimizer": "o", "n": 2, "names": names}


def test_ranks_that_resume_differently_are_named_at_the_folder_each_made_for_itself():
    from ddp_lab.doctor.checks._resume_judge import judge_differ
    from ddp_lab.doctor.checks.api import Evidence

    mk = "t.py:30: folder = tempfile.mkdtemp()"
    ranks = [{"resume-starts": [starts("a")], "resume-folders": [{"line": mk, "path": "/x/a1"}],
              "resume-reads": [{"where": "t.py:12: ck = torch.load(p)", "file": "/x/a1/c.pt", "step": 4}]},
             {"resume-starts": [starts("b")], "resume-folders": [{"line": mk, "path": "/x/b2"}]}]
    f, = judge_differ(Evidence(ranks))
    assert (f.severity, f.where) == ("error", mk)
    assert "rank(s) 0 read a checkpoint" in f.evidence[1] and "rank(s) 1 read none" in f.evidence[1]
    shared = [dict(r, **{"resume-folders": [{"line": mk, "path": "/x/a1"}]}) for r in ranks]
    assert judge_differ(Evidence(shared))[0].where == "t.py:12: ck = torch.load(p)"  # one folder
    sharded = [dict(r, **{"resume-starts": [starts(m, names=m)]}) for r, m in zip(ranks, "ab")]
    assert judge_differ(Evidence(sharded)) == []  # other parameters on each rank (ZeRO's shards)
    unread = [{k: v for k, v in r.items() if k != "resume-reads"} for r in ranks]
    assert judge_differ(Evidence(unread)) == []  # no resume: the state check's to judge


# a checkpoint written by an earlier run (not in the watched one): what the file holds is the
# writer's word
EARLIER = '''
import sys, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
ckpt = torch.load(sys.argv[1])
opt.load_state_dict(ckpt["opt"])
RESTORE
for _ in range(2):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
dist.destroy_process_group()
'''


@pytest.mark.slow
@pytest.mark.parametrize("restore,found", [("pass", ["train.py:10"]),
                                           ('sched.load_state_dict(ckpt["sched"])', [])])
def test_a_checkpoint_of_an_earlier_run_whose_scheduler_is_not_loaded(tmp_path, restore, found):
    import torch

    from ddp_lab.doctor.watch.script import watch_script

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    for _ in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        sched.step()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, tmp_path / "earlier.pt")
    (tmp_path / "train.py").write_text(EARLIER.replace("RESTORE", restore))
    rep = watch_script(str(tmp_path / "train.py"), [str(tmp_path / "earlier.pt")], nproc=2,
                       timeout=90, checks=["resume"])
    assert [f.where.split(": ")[0] for f in rep.findings if f.code == "resume-state-lost"] == found
    assert all(not r.get("check-errors") for r in rep.evidence.ranks)
    if found:
        assert "at step 3 of its schedule" in rep.findings[0].evidence[0]
