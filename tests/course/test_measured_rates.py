"""Variant.measured: a declaration that holds only some of the time on one torch release says how
often, measured, and only then may the upgrade check set a miss of it aside."""
import pytest

from ddp_lab.course.registry import Measured, lessons


def test_a_rate_names_a_release_a_fraction_and_the_command_that_counted_it():
    m = Measured("2.14", 47, 50, "python tools/measure_rate.py 06/debug_detail broken --runs 50")
    assert m.applies_to("2.14.1+cu130") and m.applies_to("2.14.0") and m.applies_to("2.14")
    assert not m.applies_to("2.13.0+cpu") and not m.applies_to("2.140.0")
    assert "47 of 50" in m.describe() and "measure_rate.py" in m.describe()
    assert Measured("2.14.1", 1, 2, "x").applies_to("2.14.1+cpu")
    assert not Measured("2.14.1", 1, 2, "x").applies_to("2.14.10")


@pytest.mark.parametrize("bad, fragment", [
    (("2.14", 50, 50, "x"), "not a rate"),   # always held: no rate to declare
    (("2.14", 0, 50, "x"), "not a rate"),    # never held: the declaration is wrong
    (("latest", 1, 2, "x"), "release"),
    (("2.14", 1, 2, " "), "say how"),
])
def test_a_rate_that_is_not_a_measurement_is_refused(bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        Measured(*bad)


def test_rates_are_declared_only_for_releases_other_than_the_pinned_one():
    """On the pinned build every declaration holds every time (the suite runs there, without
    any bucket): a rate for it would only hide a flaky scenario."""
    import torch

    pinned = torch.__version__
    declared = [(s.key, which, m) for lesson in lessons().values() for s in lesson.scenarios
                for which in ("broken", "fixed") for m in s.variant(which).measured]
    assert declared, "06/debug_detail's crash on torch 2.14 carries a measured rate"
    assert not [d for d in declared if d[2].applies_to(pinned)], declared


def test_in_tour_counts_where_ci_meets_the_scenario(monkeypatch):
    """`tools/measure_rate.py --in-tour`: every lesson's prepare() first, then every scenario
    before this one, as the tour runs them (issue 47: 06/debug_detail held alone and not there)."""
    import importlib.util
    from types import SimpleNamespace

    from conftest import REPO
    from ddp_lab.course import registry, tour

    spec = importlib.util.spec_from_file_location("measure_rate", REPO / "tools" / "measure_rate.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    done = []
    fake = {lid: SimpleNamespace(prepare=lambda lid=lid: done.append(f"prepare {lid}"),
                                 scenarios=[SimpleNamespace(key=f"{lid}/{n}") for n in "ab"])
            for lid in ("00", "01", "02")}
    monkeypatch.setattr(registry, "lessons", lambda: fake)
    monkeypatch.setattr(tour, "run_scenario", lambda s: done.append(s.key))
    assert tool.tour_before(SimpleNamespace(key="01/b")) == 3
    assert done == ["prepare 00", "prepare 01", "prepare 02", "00/a", "00/b", "01/a"]
