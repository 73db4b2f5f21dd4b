"""The compile check (ddp_lab/doctor/checks/compiled.py): each code fails on a broken script and
stays quiet on its fixed one, each run under watch on 2 real ranks with the script's own
torch.compile settings (backend eager or aot_eager: inductor needs a C++ toolchain and minutes).

    recompiles-every-step      50 (a step counter stored on the module), 51 (float lr + scheduler),
                               blind b42 (a counter forward increments: named where forward reads it),
                               blind b66 (sizes that change every step under dynamic=False: named
                               at that torch.compile call)
    ranks-compile-differently  ranks whose training forward compiles different graphs (a warning);
                               52 (the compiled DDP model evaluated on rank 0 only, under no_grad,
                               mid-run while rank 1 compiles nothing: a warning); the same
                               evaluation on rank 0 in the warm-up step, where every rank compiles
                               (nanoGPT's iteration 0, tests/corpus/control/nanogpt): a note
    fullgraph-failed           53 (a module backward hook), 54 (fullgraph=True on the DDP wrapper)
    graph-break                a .item() in forward, retraced every step (warning); blind b41 (a
                               data-dependent `if` in forward, compiled once and run every step:
                               warning); 51's fixed script (its break at opt.step(), outside
                               forward), a break under a Python branch and one in a compiled
                               evaluation run on some steps only: notes
"""
import textwrap
import tomllib
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import corpus_report

CORPUS = Path(__file__).parents[2] / "corpus" / "watch"
CASES = [("50_compile_int_attr_recompiles", "recompiles-every-step", "warning"),
         ("51_compile_float_lr_scheduler", "recompiles-every-step", "warning"),
         ("52_compile_eval_on_rank0_only", "ranks-compile-differently", "warning"),
         ("53_compile_fullgraph_backward_hook", "fullgraph-failed", "error"),
         ("54_compile_fullgraph_on_ddp", "fullgraph-failed", "error"),
         ("b41_compiled_clamp_branch", "graph-break", "warning"),
         ("b42_compile_step_attr", "recompiles-every-step", "warning"),
         ("b66_compile_static_varlen_batches", "recompiles-every-step", "warning")]

pytestmark = pytest.mark.slow


@lru_cache(maxsize=None)
def report(path: str):
    from ddp_lab.doctor.watch.script import watch_script

    return corpus_report(path) or watch_script(path, nproc=2, timeout=150, checks=["compiled"])


def corpus(case: str, script: str):
    return report(str(CORPUS / case / script))


def fault_line(case: str) -> int:
    fault = tomllib.loads((CORPUS / case / "case.toml").read_text())["fault"]
    lines = (CORPUS / case / "broken.py").read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if fault in line]
    assert len(found) == 1, (case, fault, found)
    return found[0]


def line_of(case: str, script: str, text: str) -> str:
    """"broken.py:N: text" for the one line of the script that holds `text`."""
    lines = (CORPUS / case / script).read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, (case, text, found)
    return f"{script}:{found[0]}: {lines[found[0] - 1].strip()}"


def findings(rep, code: str):
    return [f for f in rep.findings if f.code == code]


@pytest.mark.parametrize("case,code,level", CASES)
def test_the_broken_script_is_caught_at_the_line_at_fault(case, code, level):
    rep = corpus(case, "broken.py")
    found = findings(rep, code)
    assert found and found[0].severity == level, rep.text()
    assert found[0].where.startswith(f"broken.py:{fault_line(case)}: "), found[0].where
    assert found[0].lesson == "15"


@pytest.mark.parametrize("case,code,level", CASES)
def test_the_fixed_script_gives_no_warning_or_error(case, code, level):
    rep = corpus(case, "fixed.py")
    assert rep.status == "ok", rep.text()
    assert not rep.errors and not rep.warnings, rep.text()


def test_recompiles_quote_the_guard_and_where_the_graph_reads_it():
    f = findings(corpus("50_compile_int_attr_recompiles", "broken.py"), "recompiles-every-step")[0]
    assert "rank 0: forward recompiled in steps 1, 2, 3" in f.evidence
    read = line_of("50_compile_int_attr_recompiles", "broken.py", "scale = min(")
    assert any(e.startswith("PyTorch's guard that failed: self.step == ") and f"(read at {read})" in e
               for e in f.evidence), f.evidence
    assert any("allow_unspec_int_on_nn_module" in e for e in f.evidence)  # PyTorch's own hint


def test_a_counter_forward_increments_is_named_where_forward_reads_it():
    f = findings(corpus("b42_compile_step_attr", "broken.py"), "recompiles-every-step")[0]
    writer = line_of("b42_compile_step_attr", "broken.py", "self.seen_batches += 1")
    reader = line_of("b42_compile_step_attr", "broken.py", "alpha = min(")
    assert f.where == reader
    assert any(e.startswith(f"the compiled function changes it itself at {writer} ") and reader in e
               for e in f.evidence), f.evidence


def test_sizes_compiled_anew_under_dynamic_false_are_named_at_that_compile_call():
    f = findings(corpus("b66_compile_static_varlen_batches", "broken.py"), "recompiles-every-step")[0]
    compiled = line_of("b66_compile_static_varlen_batches", "broken.py", "dynamic=False")
    assert f.where == compiled
    assert any(e.startswith(f"dynamic=False at {compiled}: ") and "make_set_enable_dynamic" in e
               for e in f.evidence), f.evidence
    assert f.fix.startswith("drop dynamic=False")


def test_one_rank_compiling_its_evaluation_while_the_others_run_compiled_is_a_warning():
    """52: rank 0 alone evaluates under no_grad after training steps: rank 1 compiles nothing in
    that step and waits in the next all-reduce for rank 0's whole compile."""
    f = findings(corpus("52_compile_eval_on_rank0_only", "broken.py"), "ranks-compile-differently")[0]
    assert f.severity == "warning"
    assert "step 2: rank 0 compiles what the others do not" in f.title
    assert "rank 1, step 2: compiled nothing" in f.evidence
    assert any(e.startswith("rank 0, step 2: compiled") and "grad_mode" in e for e in f.evidence)
    assert any(e.startswith("every graph compiled on one rank only was traced under no_grad (an "
                            "evaluation that rank runs alone), in a step in which the others "
                            "compiled nothing") for e in f.evidence), f.evidence
    assert f.where == line_of("52_compile_eval_on_rank0_only", "broken.py", "val = nn.functional")


WARMUP_EVAL = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.compile(nn.Linear(8, 2), backend="eager"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        if step % 2 == 0 and rank == 0:
            model.eval()
            with torch.no_grad():
                val = model(torch.ones(4, 8)).pow(2).mean()
            model.train()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_one_rank_compiling_its_evaluation_in_the_warm_up_is_a_note(tmp_path):
    """nanoGPT's shape: rank 0 alone evaluates at iteration 0, before its first training step,
    in the step in which every rank compiles its training graph: the graphs only rank 0
    compiles were traced under no_grad; its training graph (a recompile after the eval graph's
    grad_mode guard) is the same graph rank 1 compiles fresh."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(WARMUP_EVAL))
    rep = report(str(path))
    f = findings(rep, "ranks-compile-differently")
    assert f and f[0].severity == "info", rep.text()
    assert "step 0: rank 0 compiles what the others do not" in f[0].title
    assert any(e.startswith("rank 1, step 0: compiled ") and not e.endswith("nothing")
               for e in f[0].evidence), f[0].evidence
    assert any(e.startswith("every graph compiled on one rank only was traced under no_grad, in a "
                            "region that rank runs alone") for e in f[0].evidence), f[0].evidence
    assert f[0].where == "train.py:16: val = model(torch.ones(4, 8)).pow(2).mean()"


RANK_GRAPHS = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(nn.Module):
    def __init__(self, rank):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.keep_stats = rank == 0

    def forward(self, x):
        h = self.fc(x)
        if self.keep_stats:
            h = h * (h.detach().abs().mean() > 0)
        return h

def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.compile(Net(dist.get_rank()), backend="eager"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_ranks_compiling_different_training_graphs_is_a_warning(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(RANK_GRAPHS))
    f = findings(report(str(path)), "ranks-compile-differently")
    assert f and f[0].severity == "warning", report(str(path)).text()
    assert "step 0: rank 0 compiles what the others do not" in f[0].title
    assert f[0].where == "train.py:24: loss = model(torch.randn(4, 8)).pow(2).mean()"


def test_fullgraph_failure_quotes_pytorch_and_blames_the_hook_not_the_forward_call():
    f = findings(corpus("53_compile_fullgraph_backward_hook", "broken.py"), "fullgraph-failed")[0]
    assert f.evidence[0] == ("rank 0: PyTorch (Unsupported): Module-level backwards hooks require "
                             "compiled autograd.")
    assert "register_full_backward_hook" in f.where
    g = findings(corpus("54_compile_fullgraph_on_ddp", "broken.py"), "fullgraph-failed")[0]
    assert "set_runtime_stats_and_log" not in g.where and "fullgraph=True" in g.where


RETRACED = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.epoch = 0

    def forward(self, x):
        x = x * (1 + self.epoch)
        peak = x.abs().max().item()
        return self.fc(x / peak)

def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.compile(DDP(Net()), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model.module.epoch = step
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_graph_break_retraced_every_step_is_a_warning(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(RETRACED))
    f = findings(report(str(path)), "graph-break")
    assert f and f[0].severity == "warning", report(str(path)).text()
    assert f[0].where == "train.py:14: peak = x.abs().max().item()"
    assert "traced again in several steps: the break is recompiled, not only run" in f[0].evidence


def test_a_data_dependent_if_in_forward_is_run_every_step():
    f = findings(corpus("b41_compiled_clamp_branch", "broken.py"), "graph-break")[0]
    at = line_of("b41_compiled_clamp_branch", "broken.py", "if h.abs().max() > self.act_limit:")
    assert f.title.endswith(", every step")
    assert any(e.startswith(at.split(": ", 1)[0] + ": on the path of every call of the compiled "
                            "forward") and "(steps 1-7)" in e for e in f.evidence), f.evidence


SOME_STEPS = """
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.verbose = True

    def forward(self, x):
        h = self.fc(x)
        if self.verbose:
            print("mean activation", float(h.detach().mean()))
        return h

class Scorer(nn.Module):
    def forward(self, out):
        worst = out.abs().max().item()
        return out.mean() / worst

def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.compile(Net(), backend="eager"))
    score = torch.compile(Scorer(), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 0:
            with torch.no_grad():
                score(model(torch.randn(4, 8)))
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_break_under_a_branch_or_in_code_run_on_some_steps_is_a_note(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SOME_STEPS))
    rep = report(str(path))
    f = findings(rep, "graph-break")
    assert f and f[0].severity == "info", rep.text()
    places = " ".join(f[0].evidence)
    assert "train.py:15: print(" in places and "train.py:20: worst = out.abs().max().item()" in places
    breaks = [b for r in rep.evidence.ranks for b in r["compile-breaks"] if b.get("where")]
    assert {b["where"].split(":")[1]: b.get("every_call") for b in breaks if "every_call" in b} \
        == {"15": False, "20": True}  # the print is under `if self.verbose:`
    assert rep.evidence.ranks[0]["compile-ran"][1] == [[1, 1], [3, 3], [5, 5]]  # after steps 0, 2, 4


def test_a_graph_break_run_once_compiled_is_only_a_note():
    f = findings(corpus("51_compile_float_lr_scheduler", "fixed.py"), "graph-break")
    assert f and f[0].severity == "info"
    assert f[0].where == line_of("51_compile_float_lr_scheduler", "fixed.py", "opt.step()")
    assert any("`SGD.step` in file `torch/optim/lr_scheduler.py`" in e for e in f[0].evidence)
