"""instruments/compilewatch.py reads dynamo's recompile log: the guard that failed, and where the
user's code reads it, by its whole path (torch cuts the path in the guard's comment to a width;
the user stack trace of the same message has it whole: issue 47)."""
from ddp_lab.instruments.compilewatch import CompileWatch

MESSAGE = """Recompiling function forward in /tmp/work/run/m.py:7
    triggered by the following guard failure(s):
    - 0/0: self.count == 0                                          # self.count += 1  # mp/work/run/m.py:8 in forward (HINT: torch.compile considers integer attributes of the nn.Module to be static.)
    - User stack trace:
    -   File "/tmp/work/run/m.py", line 8, in forward
    -     self.count += 1"""


def test_the_recompile_names_the_whole_path_of_the_users_line():
    r = CompileWatch()._recompile(MESSAGE)
    assert (r.function, r.guard) == ("forward", "self.count == 0")
    assert r.where == "/tmp/work/run/m.py:8 in forward"


def test_without_a_stack_trace_the_cut_path_is_all_there_is():
    cut = "\n".join(MESSAGE.splitlines()[:3])
    assert CompileWatch()._recompile(cut).where == "mp/work/run/m.py:8 in forward"


def test_a_guard_read_in_torchs_own_code_names_no_line():
    theirs = MESSAGE.replace("m.py:8 in forward", "torch/nn/modules/module.py:1775 in _call_impl")
    assert CompileWatch()._recompile(theirs).where == ""
