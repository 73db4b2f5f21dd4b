"""Each corpus script is launched once per session (issue 46): the corpus tests, the checks'
tests (tests/doctor/checks/), the README's commands on corpus cases
(tests/test_readme_commands.py) and notebook 11 (which runs watch on case 20) share one run of
each, which tools/corpus_score.py keeps. This test runs after every other (tests/conftest.py)
and reads the session's launch log (tests/run_log.py), where each launch names the corpus file
it ran."""
from collections import Counter

import pytest

import conftest

# Tests that run a corpus file with other arguments than its case's, on purpose: another call,
# not the corpus's run again. Test -> why.
OTHER_CALLS = {
    "tests/doctor/checks/test_compile_settings.py::"
    "test_without_fullgraph_the_hook_is_a_graph_break_named_at_its_registration":
        "case 10's broken.py under compile=True without fullgraph: the graph break its case's "
        "fullgraph call cannot show",
}


def test_no_corpus_script_is_launched_twice():
    launches = [x for x in conftest._suite.launches()
                if x["corpus"] and x["test"] not in OTHER_CALLS] if conftest._suite else []
    if not launches:
        pytest.skip("no corpus script was launched in this session")
    # one doctor call launches once per strategy it checks ("doctor", "doctor tp", ...)
    twice = {f"{corpus} ({label})": n for (corpus, label), n in
             Counter((x["corpus"], x["label"]) for x in launches).items() if n > 1}
    assert not twice, f"corpus scripts launched more than once: {twice}"
