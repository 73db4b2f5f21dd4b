"""The doctor's randomness checks (ddp_lab/doctor/exam/randomness.py, lesson 14): each rank's torch,
Python `random` and NumPy seeded as a training script seeds them; random draws in forward that
are identical on every rank; Python's `random` or NumPy used in forward or while building."""
import random
from random import random as imported_random

import numpy as np
import pytest
import torch
from torch import nn

import ddp_lab
from ddp_lab.doctor import doctor
from ddp_lab.doctor.exam.randomness import (fingerprint, random_findings, watch_global_generators,
                                       watch_randomness)
from ddp_lab.doctor.sync import records


def _noop():
    return 0


@pytest.fixture(scope="module", autouse=True)
def warm_launcher():
    ddp_lab.launch(_noop, timeout=120)


# --- in one process --------------------------------------------------------------------------

def test_fingerprint_ignores_draws_with_nothing_random_in_them():
    assert fingerprint(torch.zeros(4, dtype=torch.bool)) is None
    assert fingerprint(torch.empty(0)) is None
    a = torch.tensor([True, False, True])
    assert fingerprint(a) == fingerprint(a.clone()) != fingerprint(~a)


def test_global_generators_are_found_where_they_are_called_and_restored():
    found = []
    originals = (random.choice, np.random.rand)
    with watch_global_generators(found):
        random.choice([1, 2, 3])
        np.random.rand(2)
        random.Random(0).random()  # a generator of its own: not the global one
    assert (random.choice, np.random.rand) == originals
    assert [f.split(" at ")[0] for f in found] == ["random: random.choice()",
                                                   "numpy: numpy.random.rand()"]
    assert all("test_doctor_randomness.py" in f for f in found)


def test_a_draw_through_an_imported_name_is_found_by_the_state():
    found = []
    with watch_global_generators(found):
        imported_random()
    assert found == ["random: Python's global `random` (drawn from outside any call it saw)"]


def test_dropout_masks_are_recorded_per_module():
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5))
    record, x = {}, torch.randn(3, 4)
    with watch_randomness(record, model):
        model(x)
    (draw,) = record["random_draws"]
    assert draw["op"] == "dropout" and draw["where"].startswith("module '1', test_dropout") and draw["fp"]
    assert record["global_generators"] == []


def _recs(*draws_per_rank):
    return [{"dry": {"random_draws": d, "global_generators": []}} for d in draws_per_rank]


def test_only_draws_identical_on_every_rank_are_flagged():
    same = {"op": "dropout", "where": "module 'drop'", "fp": "ab"}
    other = dict(same, fp="cd")
    (finding,) = random_findings(_recs([same], [same]))
    assert (finding.severity, finding.code, finding.lesson) == (
        "warning", "random-draws-identical-across-ranks", "14")
    assert random_findings(_recs([same], [other])) == []
    assert random_findings(_recs([dict(same, fp=None)], [dict(same, fp=None)])) == []
    assert random_findings(_recs([same])) == []  # one rank: nothing to compare


# --- on real ranks ---------------------------------------------------------------------------

class PythonNoise(nn.Module):
    """Adds noise from Python's global `random` in forward: the loss depends on the seed."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x):
        return self.lin(x) + random.gauss(0.0, 1.0)


def test_doctor_runs_repeat_and_flag_python_random_in_forward():
    x = torch.randn(4, 8)
    reports = [doctor(PythonNoise, x) for _ in range(2)]
    losses = [[records(r.stdout)["steps"]["losses"] for r in rep.run.ranks] for rep in reports]
    assert losses[0] == losses[1]            # seeded: the same draws in both runs
    assert losses[0][0] != losses[0][1]      # seeded by rank: each rank its own draws
    (finding,) = [f for f in reports[0].findings if f.code == "global-generator-in-forward"]
    assert finding.lesson == "14" and "random.gauss() at PythonNoise.forward" in finding.evidence[0]
