"""Check correct.py trains; the bug: every epoch the same order, and drop_last leaves the same samples out."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []
BATCH = 2


def train_iters(rec):
    return [s["indices"] for s in rec["sampler_iters"]][:4]   # the 4 training epochs (then accuracy passes)


def never_trained(res):
    seen = set()
    for r in res["ranks"]:
        for idx in train_iters(r):
            seen.update(idx[: len(idx) // BATCH * BATCH])
    return sorted(set(range(10)) - seen)


print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
r0 = res["ranks"][0]
a, b = first_last([l for s in r0["steps"] for l in s["losses"]], 2)
check(b < 0.5 * a, f"{len(r0['steps'])} steps, loss {a:.3f} -> {b:.3f}", fail)
check(max_rank_diff(res) == 0.0, "ranks' final parameters identical", fail)
o = [tuple(x) for x in train_iters(r0)]
check(len(set(o)) == len(o), f"{len(set(o))} distinct orders in {len(o)} epochs", fail)
print(f"  info samples never trained on: {never_trained(res)}")

print("bug_no_set_epoch.py")
res = run(os.path.join(HERE, "bug_no_set_epoch.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
for r in res["ranks"]:
    o = [tuple(x) for x in train_iters(r)]
    check(len(o) == 4 and len(set(o)) == 1, f"rank {r['rank']}: 4 epochs, {len(set(o))} distinct order {list(o[0])}", fail)
nt = never_trained(res)
check(len(nt) == 2, f"drop_last drops the same sample on each rank every epoch: samples {nt} never trained on", fail)
finish(fail)
