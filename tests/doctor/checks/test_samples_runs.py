"""Watch check "samples" over the whole run and whatever the data source
(ddp_lab/doctor/checks/samples.py with _samples_runs.py, _samples_rows.py, _samples_overlap.py):
a training epoch that replays an earlier one's order (epoch-order-replayed), an evaluation pass
over a padding DistributedSampler whose results are combined (eval-sampler-pads), and the same
input rows trained on several ranks (rows-on-several-ranks). Each code: its blind corpus case
(broken caught on the fault line; fixed quiet, in the corpus test), a route of its own written
here (another way into the same invariant), and the legitimate shapes that must stay quiet;
then the parts on plain data (the row hash, the line of a loop built as a generator, the rules
that keep chance out)."""
import os
import sys
import textwrap

import pytest

from ddp_lab.doctor.checks import _samples_overlap, _samples_runs
from ddp_lab.doctor.checks._samples_rows import ROWS, on_device, row_hashes
from ddp_lab.doctor.checks.api import Evidence
from ddp_lab.doctor.frames import ScriptFiles
from ddp_lab.doctor.watch.script import watch_script
from conftest import corpus_report

CORPUS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "corpus", "watch")
CASES = {  # blind case -> (code, a unique substring of broken.py's faulty line)
    "b22_resume_replays_epoch_order": ("epoch-order-replayed", "data = batches(loader, sampler)"),
    "b31_iterable_worker_only_shard": ("rows-on-several-ranks", "start, stride = (0, 1) if info"),
    "b35_eval_sampler_padding": ("eval-sampler-pads", "sampler=DistributedSampler(val_set"),
}


def run(path):
    return corpus_report(path) or watch_script(str(path), nproc=2, timeout=90, checks=["samples"])


def line_of(path, text):
    with open(path) as f:
        found = [n for n, line in enumerate(f, 1) if text in line]
    assert len(found) == 1, f"{text!r} is not one line of {path}"
    return found[0]


def loud(report, check_codes=None):
    return [(f.code, f.severity, f.where) for f in report.findings if f.severity != "info"
            and (check_codes is None or f.code in check_codes)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_blind_case_is_caught_on_its_line(case):
    code, fault = CASES[case]
    path = os.path.join(CORPUS, case, "broken.py")
    hits = [f for f in run(path).findings if f.code == code]
    assert hits and hits[0].severity == "warning" and hits[0].lesson == "07", hits
    assert hits[0].where.startswith(f"broken.py:{line_of(path, fault)}: "), hits[0].where


def write(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return path


HEAD = """
import torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))

def fit(model, opt, xb, yb):
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
"""

# A resume through another route than b22's: the resumed job builds its own loader at another
# line and iterates it without set_epoch, so its sampler draws epoch 0's order again.
RESUMED = HEAD + """
def resumed_loader(ds):
    return DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, seed=3))

def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = data(32, 0)
    sampler = DistributedSampler(ds, seed=3)
    loader = DataLoader(ds, batch_size=4, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            fit(model, opt, xb, yb)
    loader = resumed_loader(ds)  # the job restarted at epoch 2
    for xr, yr in loader:
        fit(model, opt, xr, yr)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_resumed_loader_at_another_line_that_replays_epoch_0_is_caught(tmp_path):
    path = write(tmp_path, RESUMED)
    report = run(path)
    hits = [f for f in report.findings if f.code == "epoch-order-replayed"]
    assert hits and hits[0].severity == "warning", loud(report)
    assert hits[0].where == f"train.py:{line_of(path, 'for xr, yr in loader:')}: for xr, yr in loader:"
    assert "sampler epoch 0" in " ".join(hits[0].evidence)
    assert not loud(report, {"sampler-epoch-not-set", "sample-on-several-ranks"})


# Hand-made shards through a generator, no DataLoader: every rank walks the whole tensor.
UNSHARDED = HEAD + """
def batches(x, y, size):
    for i in range(0, len(x), size):
        yield x[i:i + size], y[i:i + size]

def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = data(32, 0).tensors
    for xb, yb in batches(x, y, 8):
        fit(model, opt, xb, yb)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_a_generator_that_forgets_the_rank_is_caught(tmp_path):
    path = write(tmp_path, UNSHARDED)
    report = run(path)
    hits = [f for f in report.findings if f.code == "rows-on-several-ranks"]
    assert hits and hits[0].severity == "warning", [(f.code, f.severity) for f in report.findings]
    assert hits[0].where == f"train.py:{line_of(path, 'model(xb)')}: " \
                            "loss = nn.functional.mse_loss(model(xb), yb)"
    assert "32 of 32 rows" in hits[0].title


# Another route into padded evaluation than b35's all_reduce of sums: predictions gathered with
# all_gather_object. A second padded loader whose loss each rank keeps to itself stays quiet.
GATHERED = HEAD + """
def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train, val, probe = data(16, 0), data(7, 1), data(9, 2)
    sampler = DistributedSampler(train)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in DataLoader(train, batch_size=4, sampler=sampler):
            fit(model, opt, xb, yb)
        model.eval()
        with torch.no_grad():
            mine = [model(xv).squeeze(1).tolist() for xv, _ in
                    DataLoader(val, batch_size=4, sampler=DistributedSampler(val, shuffle=False))]
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            local = sum(nn.functional.mse_loss(model(xp), yp).item() for xp, yp in
                        DataLoader(probe, batch_size=4, sampler=DistributedSampler(probe, shuffle=False)))
        model.train()
        print(f"rank {dist.get_rank()} probe loss {local:.3f}")
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_padded_predictions_gathered_across_ranks_are_caught(tmp_path):
    path = write(tmp_path, GATHERED)
    report = run(path)
    hits = [f for f in report.findings if f.code == "eval-sampler-pads"]
    assert [f.severity for f in hits] == ["warning"], loud(report)
    assert hits[0].where == f"train.py:{line_of(path, 'DataLoader(val,')}: " \
        "DataLoader(val, batch_size=4, sampler=DistributedSampler(val, shuffle=False))]"
    assert "counts 1 sample(s) twice" in hits[0].title and "index 0" in " ".join(hits[0].evidence)


# What must stay quiet: a shuffled training loader set_epoch'd each epoch (41 samples: one padded
# repeat), a second training loader over other data of the same length and seed (its indices are
# the first one's), a third over the first one's data in lockstep (two views of each sample), a
# validation pass in the same order every epoch over an even set (its
# results all_reduced), a padded evaluation set with drop_last=True, a generator sharded by rank,
# an auxiliary DDP model fed constant rows, and one fed synthetic rows made the same on every
# rank (a note).
QUIET = HEAD + """
def shard(x, y, size):
    r, w = dist.get_rank(), dist.get_world_size()
    for i in range(r * size, len(x), w * size):
        yield x[i:i + size], y[i:i + size]

def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(6, 1))
    aux = DDP(nn.Linear(3, 1))
    synth = DDP(nn.Linear(5, 1))
    opt = torch.optim.SGD(list(model.parameters()) + list(aux.parameters())
                          + list(synth.parameters()), lr=0.01)
    a, b, val, odd = data(41, 0), data(41, 1), data(20, 2), data(21, 3)
    sa, sb, sc = DistributedSampler(a, seed=5), DistributedSampler(b, seed=5), DistributedSampler(a, seed=5)
    la, lb = DataLoader(a, batch_size=4, sampler=sa), DataLoader(b, batch_size=4, sampler=sb)
    lc = DataLoader(a, batch_size=4, sampler=sc)
    lv = DataLoader(val, batch_size=4, sampler=DistributedSampler(val, shuffle=False))
    lo = DataLoader(odd, batch_size=4, sampler=DistributedSampler(odd, shuffle=False, drop_last=True))
    x, y = data(48, 4).tensors
    g = torch.Generator().manual_seed(0)
    for epoch in range(3):
        for sampler in (sa, sb, sc):
            sampler.set_epoch(epoch)
        for (xa, ya), (xb, yb), (xc, yc) in zip(la, lb, lc):
            fit(model, opt, xa, ya)
            fit(model, opt, xb, yb)
            fit(model, opt, xc + 0.01 * torch.randn_like(xc), yc)
        for xs, ys in shard(x, y, 4):
            fit(model, opt, xs, ys)
            fit(aux, opt, torch.ones(4, 3), torch.zeros(4, 1))
            fit(synth, opt, torch.randn(4, 5, generator=g), torch.zeros(4, 1))
        with torch.no_grad():
            total = torch.zeros(2)
            for loader in (lv, lo):
                for xv, yv in loader:
                    total += torch.tensor([nn.functional.mse_loss(model(xv), yv).item(), 1.0])
            dist.all_reduce(total)
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
"""


def test_legitimate_shapes_stay_quiet(tmp_path):
    report = run(write(tmp_path, QUIET))
    assert report.status == "ok" and loud(report) == []
    ranks = report.evidence.ranks
    assert all(not r.get("check-errors") for r in ranks), [r.get("check-errors") for r in ranks]
    segs = [s for r in ranks for s in r["samples-rows"]["segments"]]
    assert len({tuple(s["group"]) for s in segs}) == 1 and len(segs) >= 2 * 3 * 3
    notes = [f for f in report.findings if f.code == "rows-on-several-ranks"]
    assert notes and notes[0].severity == "info" and "made the same on every rank" in notes[0].title
    assert any(f.code == "sample-on-several-ranks" and f.severity == "info" for f in report.findings)


# --- the parts, on plain data -------------------------------------------------------------------

def test_a_row_hash_is_the_rows_whatever_the_batch_around_it():
    import torch

    w = {}
    x = torch.randn(6, 3, 4)
    h = row_hashes(x, w)
    assert h == row_hashes(x.clone(), w) and len(set(h)) == 6
    assert row_hashes(x[[4, 1]], w) == [h[4], h[1]]  # a row hashes the same in another batch
    assert row_hashes(x.transpose(1, 2).contiguous().transpose(1, 2), w) == h  # strides
    assert row_hashes(x.reshape(6, 12), w) == h  # the same values a row
    assert set(row_hashes(x.double(), w)).isdisjoint(h)  # other values: another hash
    assert row_hashes(torch.arange(8), w) is None  # one value a row: not a sample's identity
    assert len(row_hashes(torch.randn(ROWS + 5, 2).bfloat16(), w)) == ROWS
    long = torch.randn(3, 10_000)
    assert len(set(row_hashes(long, w))) == 3


def test_the_hash_off_the_cpu_tells_rows_apart_the_same_way():
    """The accelerator's path (int64 on the tensor's device, read back at the end), run here on
    the CPU's tensors: this machine has no accelerator."""
    import torch

    bits = torch.randn(5, 7).view(torch.int32)
    h = on_device(bits, {}, 3)
    assert isinstance(h, torch.Tensor) and h.dtype == torch.int64
    again = on_device(bits[[3, 0]].contiguous(), {}, 3).tolist()  # fresh weights: the same
    assert again == [h[3].item(), h[0].item()] and len(set(h.tolist())) == 5
    assert all(0 <= v < 1 << 48 for v in h.tolist())


def test_the_line_of_a_loop_built_as_a_generator_is_where_it_was_built():
    files = ScriptFiles(__file__)
    seen = []

    def endless(items):
        for item in items:
            seen.append(files.loop_start(sys._getframe()))
            yield item

    data = endless([1])  # the line named
    next(data)
    assert seen[0][1] == line_of(__file__, "  # the line " + "named")
    for _ in endless([2]):  # held by no name: the generator's own line
        pass
    assert seen[1][1] == line_of(__file__, "seen.append(files.loop_start(sys._" + "getframe()))")


def epoch(seq, head, start, end, k=0, sampler_epoch=0, **more):
    return dict({"line": "t.py:9: for b in loader:", "began": "", "start": start, "end": end,
                 "complete": True, "unindexed": False, "sampler_epoch": sampler_epoch,
                 "n": len(head), "k": k, "seq": seq, "head": head, "backwards": 1,
                 "reduced": 0}, **more)


def loader(epochs, n, line="t.py:5: loader = DataLoader(ds)"):
    return {"line": line, "epochs": epochs,
            "dataset": {"type": "TensorDataset", "iterable": False, "len": n, "fingerprint": "f",
                        "layers": []},
            "sampler": {"type": "DistributedSampler", "line": "", "distributed": True,
                        "shuffles": True, "dataset_len": n, "len": n // 2}}


def test_a_replay_is_told_from_chance_by_what_the_prefix_is_worth():
    def ranks(n, heads):
        return Evidence([{"samples": [loader([epoch(0, h, 0, 2), epoch(1, h[::-1], 2, 4, 1, 1),
                                              epoch(2, h, 4, 6, 2, 0)], n)]} for h in heads])

    found = _samples_runs.replays(ranks(16, [[3, 9, 1, 14, 6, 0, 12, 5], [8, 2, 15, 7, 11, 4, 10, 13]]))
    assert [f.code for f in found] == ["epoch-order-replayed"]
    assert _samples_runs.replays(ranks(4, [[3, 1], [0, 2]])) == []  # 4! orders: chance
    evaluation = Evidence([{"samples": [loader([epoch(0, [3, 9, 1, 14, 6, 0, 12, 5], 0, 0, backwards=0),
                                                epoch(1, [3, 9, 1, 14, 6, 0, 12, 5], 0, 0, 1, backwards=0)],
                                               16)]}] * 2)
    assert _samples_runs.replays(evaluation) == []  # evaluation passes replay by design
    h = [3, 9, 1, 14, 6, 0, 12, 5]
    lockstep = Evidence([{"samples": [loader([epoch(0, h, 0, 2, last=2)], 16),
                                      loader([epoch(1, h, 0, 2)], 16, "t.py:6: views = DataLoader(ds)")]}] * 2)
    assert _samples_runs.replays(lockstep) == []  # two views of each sample, drawn together


def test_padding_counts_only_where_the_results_are_combined():
    def ranks(reduced, drop_last=False):
        out = []
        for r in range(2):
            ld = loader([epoch(0, [r], 3, 3, backwards=0, reduced=reduced)], 7)
            ld["sampler"].update(distributed=True, sampler_drop_last=drop_last, total_size=8,
                                 num_replicas=2, line="t.py:4: s = DistributedSampler(val)")
            out.append({"samples": [ld]})
        return Evidence(out)

    assert [f.code for f in _samples_runs.eval_padding(ranks(1))] == ["eval-sampler-pads"]
    assert _samples_runs.eval_padding(ranks(0)) == []  # each rank keeps its own metric


def test_rows_that_repeat_within_a_rank_or_a_fixed_batch_are_not_samples_told_apart():
    def segs(rows_per_rank, tag=("step", "", 0), view=False):
        return {r: {"tag": list(tag), "group": [0, 1], "n": len(rows), "rows": rows,
                    "step": tag[2], "view": view} for r, rows in enumerate(rows_per_rank)}

    assert _samples_overlap._compare(segs([[1, 1, 1, 2], [1, 1, 1, 2]])) is None
    assert _samples_overlap._compare(segs([[1, 2, 3], [3, 4, 5]]))["shared"] == 1
    fixed = [segs([[1, 2, 3], [1, 2, 3]], ("step", "", s)) for s in range(3)]
    assert not _samples_overlap._a_data_set(fixed)
    passes = [segs([[1, 2], [1, 2]], ("step", "", 0)), segs([[3, 4], [3, 4]], ("step", "", 1)),
              segs([[1, 2], [1, 2]], ("step", "", 2))]
    assert _samples_overlap._a_data_set(passes)
    fresh = [segs([[10 * s + 1, 10 * s + 2]] * 2, ("step", "", s)) for s in range(3)]
    assert not _samples_overlap._a_data_set(fresh)
    assert _samples_overlap._a_data_set([segs([[7, 8]] * 2, view=True)])
