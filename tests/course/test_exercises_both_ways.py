"""Every lesson's exercise checked both ways (issue 38, point 1): left undone, and solved.

Lesson 16 punished the right answer: a learner who solved its exercise saw `passed: True`, then
the Solutions cell raised AssertionError, because it asserted that the exercise was still
undone (`assert solution.passed and not verdict.passed`).

Left undone is the notebook as committed: strict nbval executes every notebook, exercise cells
and solution cells included, and fails on any cell that raises (pytest's own collection of
notebooks/, and the portable-kernel pass). Here: nbval must skip none of those cells.

Solved costs a second run, and whole notebooks twice would cost the suite minutes it does not
have (measured: 17-58 s a notebook, in a fresh kernel, under load). So the analysis (ast,
statement by statement, a function's body read where it is defined) first finds what can
behave differently once an exercise is solved: a statement of the exercise cells that reads a
value an earlier one assigned (`print(verdict.problems[0])`), and a later cell that reads what
the exercise cells bound (the learner's `verdict`, a subclass of the learner's class). Where
there is none, the exercise ends with its checker's verdict displayed and nothing reads it:
solving it changes no later cell, and nbval's run stands for both ways. Where there is some,
those cells run here with each exercise cell solved (SOLVED: the solution's own definition of
the name the learner edits, or the learner's edit spelled out), with the earlier cells they
read names from, in one kernel emptied before each notebook. A check right after the exercise
cells asserts that the solved exercise passes its checker (the edit is a solution, not a no-op);
then no cell may raise.

Wrong answers too (issue 47): a checker that passes a wrong answer teaches it. ANSWERS writes
named answers into an exercise, right and wrong, and the checker's verdict must tell them apart.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from cell_names import names, python_of  # what a cell binds and reads

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def code(nb, tag: str) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and tag in tags(c)]


def paired() -> list[Path]:
    """The notebooks with an exercise code cell and a solution code cell."""
    out = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        if code(nb, "exercise") and code(nb, "solution"):
            out.append(path)
    return out


@dataclass
class Plan:
    """For one notebook: which cell each code cell reads each name from, and which statements
    can behave differently once the exercise is solved."""

    exercise: list[int]
    source_of: dict[int, dict[str, int]]  # cell -> {name it reads: the cell that bound it last}
    # cell -> the exercise's names it reads: in an exercise cell, a value an exercise statement
    # assigned (the checker's verdict); in a later cell, anything the exercise cells bound but
    # imports (the learner's class, the verdict, a helper the exercise defines)
    dependent: dict[int, set[str]]

    def cells_to_run(self) -> list[int]:
        need = set(self.exercise) | set(self.dependent)
        todo = list(need)
        while todo:
            for dep in self.source_of[todo.pop()].values():
                if dep not in need:
                    need.add(dep)
                    todo.append(dep)
        return sorted(need)


def plan(nb) -> Plan:
    exercise = code(nb, "exercise")
    last, source_of, dependent, state = {}, {}, {}, set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        n = names(cell.source)
        source_of[i] = {name: last[name][0] for name in n.reads if name in last}
        if i in exercise:
            for reads, assigned in n.steps:
                if reads & state:
                    dependent.setdefault(i, set()).update(reads & state)
                state |= assigned
        elif exercise and i > exercise[0]:
            hit = {name for name in n.reads if name in last and last[name][0] in exercise
                   and not last[name][1]}  # an import binds the same name either way
            if hit:
                dependent[i] = hit
        for name in n.binds:
            last[name] = (i, name in n.imports)
    return Plan(exercise, source_of, dependent)


def test_what_a_cell_reads_and_binds():
    """The analysis the solved runs stand on, on the shapes notebook cells take."""
    n = names("%matplotlib inline\nimport torch.distributed as dist\nfrom x import y as z\n"
              "def f(a, b=k):\n    import os\n    rank = dist.get_rank()\n    return a + rank + g + os.sep\n"
              "class C(Base):\n    def forward(self, x):\n        return self.w * x\n"
              "v = [w for w in ws if w > t]\nverdict = check(f, C)\nverdict.passed\nprint(undone)\n"
              "for r in runs:\n    print(r, q)\nwith open(p) as fh:\n    fh.read()")
    assert n.binds == {"dist", "z", "f", "C", "v", "verdict", "r", "fh"}
    assert n.imports == {"dist", "z"}
    assert n.reads == {"get_ipython", "k", "g", "Base", "ws", "t", "check", "undone", "runs", "q",
                       "p"}
    assert [assigned for _, assigned in n.steps if assigned] == [{"v"}, {"verdict"}, {"r"}, {"fh"}]
    cell = nbformat.v4.new_code_cell
    nb = nbformat.v4.new_notebook(cells=[
        cell("lesson = load()\nunrelated = run()"),
        cell("class Mine(Base):\n    pass\nverdict = check(lesson, Mine)\nverdict.passed",
             metadata={"tags": ["exercise"]}),
        cell("other = run(unrelated)"),
        cell("class Theirs(Mine):\n    pass\nassert check(lesson, Theirs).passed",
             metadata={"tags": ["solution"]}),
        cell("verdict = check(lesson, Base)\nassert verdict.passed", metadata={"tags": ["solution"]})])
    p = plan(nb)
    assert p.dependent == {1: {"verdict"}, 3: {"Mine"}}  # cell 4 reads its own verdict
    assert p.cells_to_run() == [0, 1, 3]
    nb.cells[1].source = "def mine():\n    pass\ncheck(lesson, mine)"  # nothing reads a result
    nb.cells[3].source = "check(lesson, load)"
    assert plan(nb).dependent == {}


# --- Left undone: the notebook as committed, which strict nbval runs ----------------------------

@pytest.mark.parametrize("path", paired(), ids=lambda p: p.stem)
def test_left_undone_is_what_strict_nbval_runs(path):
    """nbval runs the committed notebook, exercise undone: it must skip none of the pair's
    cells, and each must have run to the end when the notebook was executed."""
    nb = nbformat.read(path, as_version=4)
    for i in code(nb, "exercise") + code(nb, "solution"):
        cell = nb.cells[i]
        # nbval's markers that skip a cell or let it raise (tags, or comments in the cell)
        excused = {t for t in tags(cell) if t.lower() in ("nbval-skip", "raises-exception")}
        excused |= {m for m in ("NBVAL_SKIP", "NBVAL_RAISES_EXCEPTION") if m in cell.source}
        assert not excused, f"{path.name} cell {i}: {sorted(excused)}"
        assert cell.get("execution_count"), f"{path.name} cell {i}: not executed"
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.name} cell {i} raised when executed: {errors[0].ename}"


# --- Solved: each exercise replaced by what its solution does ----------------------------------

@dataclass(frozen=True)
class Solved:
    """How a learner solves a notebook's exercise cells. `defs`: names the exercise defines that
    the solution defines again (the solution's definition replaces the exercise's); `edits`:
    (old, new) text edits, where the solution names its version differently; `check`: an
    expression that holds once the exercise cells have run solved."""

    check: str
    defs: tuple[str, ...] = ()
    edits: tuple[tuple[str, str], ...] = ()


# Only the notebooks where a statement reads what the exercise left behind (plan().dependent);
# in the others the exercise ends with its checker's verdict displayed, which nothing reads, so
# solving it changes no later cell: nbval's undone run stands for both ways.
SOLVED = {
    "01_parameter_registration": Solved(
        "verdict.passed and aux_verdict.passed",
        edits=(('self.heads = {"mean": nn.Linear(8, 1), "gate": nn.Linear(8, 1)}',
                'self.heads = nn.ModuleDict({"mean": nn.Linear(8, 1), "gate": nn.Linear(8, 1)})'),
               ("        ...  # use self.aux_head here\n",
                "        h = torch.relu(self.body(x))\n"
                "        return self.head(h) + 0.1 * self.aux_head(h)\n"),
               ('# try_fix(lesson.scenario("unused_parameter"), model_cls=YourNet)',
                'aux_verdict = try_fix(lesson.scenario("unused_parameter"), model_cls=YourNet)'))),
    "02_device_and_dtype": Solved(
        "all(v.passed for v in verdicts)",
        edits=(("self.kernel = torch.randn(8, 8) / 8",
                'self.register_buffer("kernel", torch.randn(8, 8) / 8)'),
               ("acc = torch.zeros(x.shape[0], 8)", "acc = x.new_zeros(x.shape[0], 8)"))),
    "04_mixed_precision": Solved(
        "verdict.passed",
        edits=(("    @staticmethod\n    def forward(ctx, x, weight, bias):",
                "    @staticmethod\n    @torch.amp.custom_fwd(device_type=m.DEVICE_TYPE)\n"
                "    def forward(ctx, x, weight, bias):"),
               ("    @staticmethod\n    def backward(ctx, grad_out):",
                "    @staticmethod\n    @torch.amp.custom_bwd(device_type=m.DEVICE_TYPE)\n"
                "    def backward(ctx, grad_out):"))),
    "05_gradients_and_checkpointing": Solved(
        "verdict.passed", edits=(("        g *= x\n        return self.head(g)",
                                  "        return self.head(g * x)"),)),
    "06_logging_and_debugging": Solved(
        '[collective_of(r.stack) for r in hang.ranks] == ["barrier", None]',
        defs=("collective_of",)),
    "11_doctor": Solved("mine.ok", defs=("MyNet",)),
    "12_sharded_modules": Solved(
        "verdict.passed", edits=(("return float(weight.norm())  # change this line",
                                  "return float(weight.norm().full_tensor())"),)),
    "16_tensor_parallel_and_checkpoints": Solved(
        "verdict.passed", edits=(('my_plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}',
                                  'my_plan = {"up": ColwiseParallel(use_local_output=False), '
                                  '"down": RowwiseParallel()}'),)),
    "17_start_restart_resume": Solved("verdict.passed", defs=("my_state",)),
}


def test_a_solved_run_is_declared_wherever_solving_can_change_a_cell():
    """Which notebooks need a solved run is the analysis's answer, not a list kept by hand: a
    new lesson whose solution reads the learner's verdict needs its entry in SOLVED."""
    needed = {}
    for path in paired():
        dependent = plan(nbformat.read(path, as_version=4)).dependent
        if dependent:
            needed[path.stem] = dependent
    assert sorted(SOLVED) == sorted(needed), (
        "SOLVED must say how to solve exactly the exercises something reads after them: "
        f"{ {k: sorted(set().union(*v.values())) for k, v in needed.items()} }")


def top_level_def(source: str, name: str) -> str | None:
    """The source text of the top-level def or class `name` in a cell, decorators included."""
    text = python_of(source)
    lines = text.splitlines(keepends=True)
    for stmt in ast.parse(text).body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and stmt.name == name:
            start = min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)])
            return "".join(lines[start - 1:stmt.end_lineno])
    return None


def solved_exercise(nb, solved: Solved) -> dict[int, str]:
    """Each exercise code cell's source, solved."""
    sources = {i: nb.cells[i].source for i in code(nb, "exercise")}
    for name in solved.defs:
        theirs = [t for i in code(nb, "solution") if (t := top_level_def(nb.cells[i].source, name))]
        mine = [(i, t) for i, s in sources.items() if (t := top_level_def(s, name))]
        assert len(theirs) == 1 and len(mine) == 1, f"{name}: not defined once in each"
        (i, text), = mine
        assert text in sources[i], f"{name}: the exercise cell's text has magics around it"
        sources[i] = sources[i].replace(text, theirs[0].rstrip("\n") + "\n")
    for old, new in solved.edits:
        where = [i for i, s in sources.items() if s.count(old) == 1]
        assert len(where) == 1, f"the exercise no longer reads {old!r}: update SOLVED"
        sources[where[0]] = sources[where[0]].replace(old, new)
    assert sources != {i: nb.cells[i].source for i in sources}, "SOLVED changes nothing"
    return sources


def solved_cells(path: Path) -> list[tuple[int, str]]:
    """(index in the notebook, source) of the cells that matter, exercise solved, and a check
    after the exercise cells (index -1)."""
    nb = nbformat.read(path, as_version=4)
    solved = SOLVED[path.stem]
    sources = solved_exercise(nb, solved)
    p = plan(nb)
    out = []
    for i in p.cells_to_run():
        out.append((i, sources.get(i, nb.cells[i].source)))
        if i == p.exercise[-1]:
            out.append((-1, f"assert {solved.check}, 'the solved exercise does not pass its checker'"))
    return out


@pytest.fixture(scope="module")
def kernel():
    """One kernel for the module, emptied (`%reset -f`) before each notebook: the notebooks'
    cells see only what they define, and torch is imported once, not once a notebook."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", cwd=str(REPO / "notebooks"))
    yield kc
    kc.stop_channels()
    km.shutdown_kernel()


def execute(kc, source: str, timeout: float = 300) -> dict:
    """Run `source` in the kernel; its execute_reply's content (status, and the error's)."""
    reply = kc.execute_interactive(source, timeout=timeout, output_hook=lambda msg: None,
                                   allow_stdin=False)
    return reply["content"]


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(SOLVED))
def test_solved_no_cell_raises(stem, kernel):
    path = REPO / "notebooks" / f"{stem}.ipynb"
    assert execute(kernel, "%reset -f")["status"] == "ok"
    for index, source in solved_cells(path):
        content = execute(kernel, source)
        if content["status"] != "ok":
            where = "the check after the solved exercise" if index < 0 else f"cell {index}"
            trace = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(content.get("traceback", [])))
            pytest.fail(f"{path.name}, exercise solved: {where} raised "
                        f"{content.get('ename')}: {content.get('evalue')}\n{trace[-3000:]}")


# --- Right and wrong answers: a checker that cannot fail a wrong answer is a defect ------------

@dataclass(frozen=True)
class Answer:
    """One answer to a notebook's exercise, written into its cells as `Solved` spells an edit
    (its `check` unused), and whether the checker must pass it."""

    name: str
    passes: bool
    solved: Solved


_L19_START = ("    squares = [local(p.grad).pow(2).sum() for p in params]  # plain tensors: a shard, "
              "or the whole\n"
              "    return float(torch.stack(squares).sum().sqrt())  # <- this rank's only\n")
_L19_VERDICT = ('try_fix(lesson.scenario("clip_local_norm"), norm=my_norm)',
                'verdict = try_fix(lesson.scenario("clip_local_norm"), norm=my_norm)')

# Issue 47: lesson 19's checker passed two wrong norms (it checked only that the ranks agree), and
# the answer its text asked for failed (down.bias, a Replicate DTensor, met `+=` on a plain tensor).
ANSWERS = {
    "19_drift_nobody_reports": (
        Answer("as the text asks: the shards' squares all-reduced, the whole ones added with +=",
               True, Solved("", edits=((_L19_START, (
                   "    total = torch.zeros((), dtype=torch.float64)\n"
                   "    for p in params:\n"
                   "        if is_sharded(p.grad):\n"
                   "            total += local(p.grad).pow(2).sum()\n"
                   "    dist.all_reduce(total)\n"
                   "    for p in params:\n"
                   "        if not is_sharded(p.grad):\n"
                   "            total += local(p.grad).pow(2).sum()\n"
                   "    return float(total.sqrt())\n")), _L19_VERDICT))),
        Answer("the solution", True, Solved("", defs=("my_norm",), edits=(_L19_VERDICT,))),
        Answer("every square all-reduced: the whole gradients counted once per rank", False,
               Solved("", edits=((_L19_START, (
                   "    total = torch.stack([local(p.grad).pow(2).sum() for p in params]).sum()\n"
                   "    dist.all_reduce(total)\n"
                   "    return float(total.sqrt())\n")), _L19_VERDICT))),
        Answer("the mean of the ranks' own norms", False, Solved("", edits=((_L19_START, (
                   "    norm = torch.stack([local(p.grad).pow(2).sum() for p in params])"
                   ".sum().sqrt()\n"
                   "    dist.all_reduce(norm)\n"
                   "    return float(norm / dist.get_world_size())\n")), _L19_VERDICT))),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(("stem", "answer"),
                         [(stem, a) for stem, answers in ANSWERS.items() for a in answers],
                         ids=lambda x: x if isinstance(x, str) else x.name.split(":")[0])
def test_the_checker_passes_right_answers_and_fails_wrong_ones(stem, answer, kernel):
    """Each answer written into the exercise cells (with the cells they read names from), run in
    the kernel: the checker's `verdict` must pass the right answers and fail the wrong ones."""
    path = REPO / "notebooks" / f"{stem}.ipynb"
    nb = nbformat.read(path, as_version=4)
    sources = solved_exercise(nb, answer.solved)
    assert execute(kernel, "%reset -f")["status"] == "ok"
    for index in plan(nb).cells_to_run():
        content = execute(kernel, sources.get(index, nb.cells[index].source))
        assert content["status"] == "ok", (
            f"{path.name}, {answer.name}: cell {index} raised {content.get('ename')}: "
            f"{content.get('evalue')}")
    verdict = execute(kernel, f"assert verdict.passed is {answer.passes}, repr(verdict)")
    assert verdict["status"] == "ok", (
        f"{path.name}: the checker {'failed' if answer.passes else 'passed'} "
        f"{answer.name!r}: {verdict.get('evalue')}")
