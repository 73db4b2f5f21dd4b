"""Check correct.py trains with one split everywhere; the bugs: splits differ per rank, epoch order repeats."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []


def train_orders(rec):
    n = len(rec["random_splits"][0]["indices"][0])
    return [tuple(s["indices"]) for s in rec["sampler_iters"] if s["dataset_len"] == n]


def split_report(res):
    r0, r1 = res["ranks"]
    tr0, te0 = map(set, r0["random_splits"][0]["indices"])
    tr1, te1 = map(set, r1["random_splits"][0]["indices"])
    restart_same = r0["random_splits"][0]["indices"] == r0["random_splits"][1]["indices"]
    return tr0 == tr1, len(te0 & tr1), len(te1 & tr0), len(te0), restart_same


print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
r0, r1 = res["ranks"]
a, b = first_last([l for s in r0["steps"] for l in s["losses"]])
check(b < 0.9 * a, f"train loss goes down: {a:.3f} -> {b:.3f} ({len(r0['steps'])} steps)", fail)
check(max_rank_diff(res) == 0.0, f"ranks' final parameters identical (max diff {max_rank_diff(res)})", fail)
same, x01, x10, nte, rs = split_report(res)
check(same and x01 == 0 and rs, f"one train/test split on both ranks and across the restart (test set {nte})", fail)
o = train_orders(r0)
check(len(set(o)) == len(o), f"{len(set(o))} distinct train orders in {len(o)} epochs", fail)

print("bug_random_split_no_generator.py")
res = run(os.path.join(HERE, "bug_random_split_no_generator.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
same, x01, x10, nte, rs = split_report(res)
print(f"  info initial_seed rank0 {res['ranks'][0]['initial_seed']} rank1 {res['ranks'][1]['initial_seed']}")
check(not same and x01 > 0,
      f"ranks' train sets differ: {x01}/{nte} of rank 0's test samples are in rank 1's train set "
      f"({x10}/{nte} the other way); split changes at the restart: {not rs}", fail)

print("bug_no_set_epoch.py")
res = run(os.path.join(HERE, "bug_no_set_epoch.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
for r in res["ranks"]:
    o = train_orders(r)
    check(len(o) == 4 and len(set(o)) == 1, f"rank {r['rank']}: {len(o)} train epochs, {len(set(o))} distinct order", fail)
finish(fail)
