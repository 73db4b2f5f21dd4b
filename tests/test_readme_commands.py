"""Every command the README and its docs/ pages show runs as shown (from the repository's root,
where they run them). The commands are read from the pages themselves: each line of a code block
that starts with `ddp-lab`, `.venv/bin/...` or `python3 -m venv`, and every inline
`ddp-lab doctor examples/...`.
Each is either run here, in this process (the doctor's examples, on the files in `examples/`,
with the output lines the README prints under them), or named below with the test that already
runs it, or a synopsis with placeholders. A command added to the README that is none of these
fails `test_every_readme_command_is_run_somewhere`. The README stays a newcomer's start (at
most 200 lines), and every relative link of the README and docs/ resolves, anchors included."""
import inspect
import os
import re
import shlex

import pytest

from conftest import REPO as ROOT
from conftest import corpus_report, corpus_score
from ddp_lab.cli import main
from ddp_lab.kit.docpages import docs_of, resolve, slug

DOCS = docs_of(ROOT)  # README.md, then docs/*.md
README = "\n".join(d.text for d in DOCS)  # the commands may sit on any of the pages
PLACEHOLDER = re.compile(r"\[|path/to/|\bOUT\b|\.\.\.")

# command -> (the test file that runs it, a fragment of that file which is the run)
ELSEWHERE = {
    "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/ddp-lab build-ops "
    "&& .venv/bin/ddp-lab tour": (".ci/run", "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt"
                                  " && .venv/bin/ddp-lab build-ops && .venv/bin/ddp-lab tour"),
    ".venv/bin/python -m pytest": (".ci/run", ".venv/bin/python -m pytest"),
    ".venv/bin/torchrun --nproc-per-node 2 -m ddp_lab run 00 source_example --variant fixed":
        ("tests/test_cli.py", '"-m", "ddp_lab", "run", "00", "source_example", "--variant", "fixed"'),
    "ddp-lab list": ("tests/test_cli.py", 'main(["list"])'),
    "ddp-lab check": ("tests/kit/test_preflight.py", 'main(["check"])'),
    # JupyterLab started from the environment's Python, a lesson opened and run in it
    ".venv/bin/jupyter lab notebooks/": ("tests/course/test_browser_lab.py", '"-m", "jupyterlab"'),
    "ddp-lab watch --reference --global-batch 16 examples/lesson20_per_rank_batch.py":
        ("tests/doctor/checks/test_reference_runs.py", "reference=3, global_batch=16)"),
    "ddp-lab watch examples/watch_train.py:train_step --model examples/watch_train.py:Net --save save "
    "--evaluate evaluate": ("tests/doctor/test_watch.py", '"examples/watch_train.py:Net", "--save", "save", '
                            '"--evaluate", "evaluate"'),
}
SYNOPSES_RUN_AS = {  # a synopsis line -> where its plain form runs
    "ddp-lab run": ("tests/test_cli.py", 'main(["run", "00", "rank_exits"])'),
    "ddp-lab tour": ("tests/test_cli.py", 'main(["tour", "--lesson", "00"'),
    "ddp-lab build-ops": (".ci/run", ".venv/bin/ddp-lab build-ops"),
    "ddp-lab doctor": ("tests/test_readme_commands.py", "def test_the_doctor_examples_run_as_shown"),
    "ddp-lab watch": ("tests/doctor/test_watch.py", "def test_cli_runs_the_readme_example"),
    "ddp-lab workshop build": ("tests/kit/test_workshop.py", 'main(["workshop", "build"'),
    "ddp-lab site build": ("tests/kit/test_site.py", 'main(["site", "build"'),
    # installs another torch (minutes, GBs): its report and its refusals run in the test
    ".venv/bin/python tools/upgrade_check.py": ("tests/test_upgrade_check.py", '"--report-only"'),
}


def readme_commands() -> list[tuple[str, list[str]]]:
    """(command, the comment lines printed under it) for every command the README shows."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, re.S):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            i += 1
            if not re.match(r"(ddp-lab |\.venv/bin/|python3 -m venv )", line):
                continue
            while line.endswith("\\"):
                line = line[:-1].rstrip() + " " + lines[i].strip()
                i += 1
            line = line.split("  #", 1)[0].strip()  # a synopsis's comment
            shown = []
            while i < len(lines) and lines[i].startswith("#"):
                shown.append(lines[i].lstrip("#").strip())
                i += 1
            found.append((line, shown))
    for cmd in re.findall(r"`(?:time )?(ddp-lab doctor examples/[^`]+)`", README):
        found.append((cmd, []))
    return found


IN_PROCESS = ("ddp-lab doctor examples/", "ddp-lab doctor tests/corpus/", "ddp-lab watch tests/corpus/",
              "ddp-lab watch --reference tests/corpus/")


def _doctor_examples():
    return [(c, shown) for c, shown in readme_commands() if c.startswith(IN_PROCESS)]


def test_every_readme_command_is_run_somewhere():
    commands = readme_commands()
    assert len(_doctor_examples()) == 9, commands  # bert, layerdrop, ten_layers; 5 corpus cases (one twice)
    for command, _ in commands:
        if command.startswith(IN_PROCESS):
            continue  # run below
        if command in ELSEWHERE:
            where, fragment = ELSEWHERE[command]
        else:
            assert PLACEHOLDER.search(command), f"the README shows {command!r}: run it here or name its test"
            where, fragment = next(v for k, v in SYNOPSES_RUN_AS.items() if command.startswith(k))
        assert fragment in (ROOT / where).read_text(), (command, where)


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("command, shown", _doctor_examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_doctor_examples_run_as_shown(command, shown, monkeypatch, capsys):
    """`ddp-lab doctor examples/X.py:Name ...` and the corpus cases the README shows (doctor and
    watch), in this process (its fork server warm: seconds each): the file exists, the module
    loads, and the README's printed lines are there, "at FILE:LINE: text" included."""
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)
    assert argv[0] == "ddp-lab"
    if any(a.startswith("tests/corpus/") for a in argv[2:]):
        _share_the_corpus_run(argv[1:], monkeypatch)
    code = main(argv[1:])
    out = _words(capsys.readouterr().out)
    for line in shown:
        assert _words(line.removesuffix("...")) in out, (line, out)
    assert code == (1 if any(l.startswith("ERROR") for l in shown) else 0), out
    if command.startswith("ddp-lab watch"):
        assert "WARN" in out and "ERROR" not in out, out
    if "layerdrop" in command:  # an info, not an error, under find_unused_parameters=True
        assert "ERROR" not in out, out
    if "ten_layers" in command:  # nothing wrong with it
        assert "ERROR" not in out and "WARNING" not in out, out


# A measured figure: a duration, a ratio, a share, a score ("33/33", "12 caught").
FIGURE = re.compile(r"\d+(?:[.,]\d+)?\s?(?:ms|s|min|minutes|seconds|hours|×|x\b|%)(?![\w-])"
                    r"|\b\d+/\d+\b|\b\d+ (?:caught|cases|false alarms)")


def test_the_readme_is_a_newcomer_s_start():
    """What it is, the two commands, the lessons, where to go next: the rest lives in docs/.
    Every measured figure lives in one place, docs/, which the README links (issue 47: it
    repeated the watch corpus's table, the cost figures and the quickstart's timings), and each
    lesson's row of the table is one line."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, len(readme.splitlines())
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, f"the README does not link docs/{page.name}"
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    assert FIGURE.findall(prose) == [], "a figure in the README: it belongs in docs/ (measured.md, ...)"
    rows = re.findall(r"^\| (\d\d) \| \[[^\]]+\]\([^)]+\) \| (.+?) \|\s*$", readme, re.M)
    assert [r for r, _ in rows] == sorted({r for r, _ in rows}) and len(rows) >= 21
    assert [(r, len(text)) for r, text in rows if len(text) > 100] == []


def _anchors(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a '# comment' in a block is no heading
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_of_the_readme_and_docs_resolves():
    checked = 0
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.text, flags=re.S)
        for href in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", href):
                continue  # https://..., an address outside the repository
            path, anchor = resolve(doc.repo_path, href)
            assert (ROOT / path).exists(), f"{doc.repo_path} links {href}: no {path}"
            if anchor and path.endswith(".md"):
                assert anchor[1:] in _anchors(ROOT / path), f"{doc.repo_path} links {href}: no such heading"
            checked += 1
    assert checked > 20, checked  # the lesson table alone has 19


def test_the_watch_example_finds_what_the_pages_say(monkeypatch, capsys):
    """The runnable watch command, as shown, exits with the status and every finding the sentence
    after it names ("It exits 0 with three warnings: `a`, `b`, ...")."""
    shown = 0
    for doc in DOCS:
        said = re.search(r"```bash\n(ddp-lab watch examples/[^\n]+)\n```\s+It exits (\d) with (\w+) "
                         r"(?:findings|warnings): (.+?);? ?[(.]", doc.text, re.S)
        if said is None:
            continue
        names = re.findall(r"`([a-z-]+)`", said.group(4))
        assert len(names) == ["one", "two", "three", "four", "five"].index(said.group(3)) + 1, names
        monkeypatch.chdir(ROOT)
        code = main(shlex.split(said.group(1))[1:])
        out = capsys.readouterr().out
        assert code == int(said.group(2)) and all(name in out for name in names), (doc.repo_path, names, out)
        shown += 1
    assert shown >= 1, "no page shows the runnable watch example and what it finds"


# --- A command on a corpus case: the corpus's run, checked to be the same call ------------------

def _share_the_corpus_run(argv: list[str], monkeypatch) -> None:
    """The README's commands on corpus cases (issue 46): the command makes the very call the
    corpus test makes (checked here, argument by argument: the script, or the model, its input's
    shape and type and every option) and gets that call's report, which tools/corpus_score.py
    keeps for the session, instead of launching the case once more
    (tests/corpus/test_corpus_runs_once.py). The command's parsing, loading of the file, input,
    options, printed report and exit status are its own, as before."""
    script = str(ROOT / next(a for a in argv[1:] if a.startswith("tests/corpus/")).split(":")[0])
    if argv[0] == "watch":
        from ddp_lab.doctor.watch import command  # the CLI's module: its name watch_script
        from ddp_lab.doctor.watch.reference_run import validate_steps

        report, call = corpus_report(script), corpus_score().watch_call(script)

        def shared(path, args=(), nproc=2, timeout=60.0, checks=None, progress=None,
                   first_step_timeout=None, output=None, reference=None, global_batch=None):
            assert (os.path.abspath(path), list(args), nproc, timeout, checks, first_step_timeout,
                    reference and validate_steps(reference), global_batch) == (script, call["args"], call["nproc"], call["timeout"],
                                                 None, None, call["reference"], None), "not the corpus's call"
            return report

        monkeypatch.setattr(command, "watch_script", shared)
        return
    import ddp_lab.doctor as package  # the package: its attribute doctor is what the CLI calls

    signature = inspect.signature(package.doctor)
    report = corpus_score().doctor_report(script)
    target, example, options = corpus_score().doctor_call(script)

    def shared(model, example_input, **kwargs):
        assert model.__name__ == target.__name__, "not the corpus's model"
        assert _shape(example_input) == _shape(example), "not the corpus's input"
        assert _settled(signature, kwargs) == _settled(signature, options), "not the corpus's options"
        return report

    monkeypatch.setattr(package, "doctor", shared)


def _shape(value):
    """A tensor's shape and dtype (the doctor's inputs are random): what makes two the same."""
    return (tuple(value.shape), str(value.dtype)) if hasattr(value, "shape") else value


def _settled(signature, kwargs: dict) -> dict:
    """Every keyword of the doctor's signature, given or default; a function by its name and file."""
    bound = signature.bind_partial(None, None, **kwargs)
    bound.apply_defaults()
    return {k: (v.__qualname__, v.__code__.co_filename) if hasattr(v, "__code__") else v
            for k, v in list(bound.arguments.items())[2:]}
