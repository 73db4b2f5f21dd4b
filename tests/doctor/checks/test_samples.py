"""Watch check "samples" (ddp_lab/doctor/checks/samples.py): which samples each rank trains on.
Each code has a failing test (a corpus case's broken.py: the code at its level, on the user's line
at fault) and a passing one (the fixed.py: no warning or error from this check); the by-design
cases (DistributedSampler's padding and dropped tail, an IterableDataset) give notes only."""
import os
import textwrap

import pytest

from ddp_lab.doctor.checks import registry
from ddp_lab.doctor.checks.samples import decode, encode
from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {  # case folder -> (code, severity, a unique substring of broken.py's faulty line)
    "20_no_distributed_sampler": ("sample-on-several-ranks", "warning",
                                  "loader = DataLoader(ds, batch_size=8, shuffle=True)"),
    "21_set_epoch_never_called": ("sampler-epoch-not-set", "warning",
                                  "for points, labels in loader:"),
    "22_sampler_seed_per_rank": ("sample-on-several-ranks", "warning",
                                 "sampler = DistributedSampler(dataset, shuffle=True, seed=seed)"),
    "23_shuffle_with_sampler": ("dataloader-refused", "error", "shuffle=True, sampler=sampler)"),
    "24_hand_shard_drops_tail": ("sample-on-no-rank", "warning",
                                 "shard = Subset(full, range(rank * per_rank, (rank + 1) * per_rank))"),
    # blind: a sampler the script builds, seeded alike on every rank: named where it was built
    "b61_weighted_sampler_every_rank": ("sample-on-several-ranks", "warning",
                                        "sampler = WeightedRandomSampler(weights, num_samples="),
}


def run(path):
    return corpus_report(path) or watch_script(path, nproc=2, timeout=60, checks=["samples"])


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_case_is_caught_on_its_line(case):
    code, severity, fault = CASES[case]
    path = os.path.join(CORPUS, case, "broken.py")
    report = run(path)
    hits = [f for f in report.findings if f.code == code]
    assert hits, [(f.code, f.severity) for f in report.findings]
    f = hits[0]
    assert f.severity == severity and f.lesson == "07"
    assert f.where.startswith(f"broken.py:{line_of(path, fault)}: ") and fault in f.where


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_case_gives_no_warning(case):
    report = run(os.path.join(CORPUS, case, "fixed.py"))
    loud = [(f.code, f.severity, f.title) for f in report.findings if f.severity != "info"]
    assert loud == []
    assert report.status == "ok"
    ranks = report.evidence.ranks
    assert all(not r.get("check-errors") for r in ranks)
    assert all(r.get("samples") for r in ranks)  # it did record the loaders


def test_the_seed_per_rank_case_also_names_the_samples_no_rank_saw():
    report = run(os.path.join(CORPUS, "22_sampler_seed_per_rank", "broken.py"))
    missing = [f for f in report.findings if f.code == "sample-on-no-rank"]
    assert missing and missing[0].severity == "warning"
    assert any("seed differs per rank" in e for e in missing[0].evidence)


BY_DESIGN = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

class Stream(IterableDataset):
    def __iter__(self):
        for i in range(dist.get_rank(), 8, dist.get_world_size()):
            yield torch.full((3,), float(i)), torch.zeros(1)

def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.arange(45 * 3, dtype=torch.float32).reshape(45, 3)
    ds = TensorDataset(x, x.sum(1, keepdim=True))
    other = TensorDataset(x + 1, x.sum(1, keepdim=True))  # another dataset: none of its
    padded = DistributedSampler(ds)                         # samples is drawn elsewhere
    dropped = DistributedSampler(other, drop_last=True)
    loaders = [DataLoader(ds, batch_size=8, sampler=padded),  # 45 on 2 ranks: one repeated
               DataLoader(other, batch_size=8, sampler=dropped),  # one dropped
               DataLoader(Stream(), batch_size=2)]
    for epoch in range(2):
        padded.set_epoch(epoch)
        dropped.set_epoch(epoch)
        for loader in loaders:
            for xb, yb in loader:
                loss = nn.functional.mse_loss(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_padding_dropped_tail_and_iterable_dataset_are_notes(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(BY_DESIGN))
    report = run(str(path))
    got = {(f.code, f.severity) for f in report.findings}
    assert got == {("sample-on-several-ranks", "info"), ("sample-on-no-rank", "info"),
                   ("samples-not-checked", "info")}, got
    notes = {f.code: f for f in report.findings}
    assert "distributed.py:116-120" in notes["sample-on-several-ranks"].title
    assert "drop_last=True" in notes["sample-on-no-rank"].title
    assert "IterableDataset" in notes["samples-not-checked"].title


def test_index_sets_round_trip():
    assert decode(encode([0, 5, 9, 44, 44], 45)) == {0, 5, 9, 44}
    assert decode(encode([], 3)) == set()


def test_the_check_is_registered_for_watch():
    check = registry()["samples"]
    assert check.tools == ("watch",) and check.lesson == "07"
    assert set(CASES[c][0] for c in CASES) <= set(check.codes)
