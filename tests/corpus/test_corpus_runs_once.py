"""Each corpus script is launched once per session and call (issue 46): the corpus tests, the
control set's (one run of correct.py per variant's arguments), the checks' tests
(tests/doctor/checks/), the README's commands on corpus cases (tests/test_readme_commands.py)
and notebook 11 (which runs watch on case 20) share one run of each, which
tools/corpus_score.py keeps (watch_run, doctor_report). This test runs after every other (tests/conftest.py)
and reads the session's launch log (tests/run_log.py), where each launch names the corpus file
it ran."""
from collections import Counter

import pytest

import conftest

# Tests that run a corpus file with other arguments than its case's, on purpose: another call,
# not the corpus's run again. Test -> why.
OTHER_CALLS = {
    "tests/doctor/checks/test_compiled_doctor.py::"
    "test_without_fullgraph_the_hook_is_a_graph_break_named_at_its_registration":
        "case 10's broken.py under compile=True without fullgraph: the graph break its case's "
        "fullgraph call cannot show",
}


def test_no_corpus_script_is_launched_twice():
    launches = [x for x in conftest._suite.launches()
                if x["corpus"] and x["test"] not in OTHER_CALLS] if conftest._suite else []
    if not launches:
        pytest.skip("no corpus script was launched in this session")
    # one doctor call launches once per strategy it checks ("doctor", "doctor tp", ...); a
    # control script once per arguments it runs with (its variants)
    calls = Counter((x["corpus"], tuple(x["argv"]), x["label"], x["ranks"]) for x in launches)
    twice = {f"{corpus} {' '.join(argv)} ({label}, {ranks} ranks)": n
             for (corpus, argv, label, ranks), n in calls.items() if n > 1}
    assert not twice, f"corpus scripts launched more than once: {twice}"
