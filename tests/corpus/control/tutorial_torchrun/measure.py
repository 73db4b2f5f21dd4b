"""Check correct.py trains and bug_no_set_epoch.py repeats the epoch order."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []


def orders(rec):
    return [tuple(s["indices"]) for s in rec["sampler_iters"]]


print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
r0, r1 = res["ranks"]
a, b = first_last([l for s in r0["steps"] for l in s["losses"]])
check(b < 0.7 * a, f"loss goes down: first steps {a:.3f} -> last steps {b:.3f}", fail)
check(max_rank_diff(res) == 0.0, f"ranks' final parameters identical (max diff {max_rank_diff(res)})", fail)
o = orders(r0)
check(len(set(o)) == len(o), f"rank 0 sees {len(set(o))} distinct orders in {len(o)} epochs", fail)
check(set(orders(r0)[0]).isdisjoint(orders(r1)[0]), "ranks' shards are disjoint", fail)
check(any(l["ok"] for l in r1["loads"]), "the restart loads the snapshot on rank 1", fail)

print("bug_no_set_epoch.py")
res = run(os.path.join(HERE, "bug_no_set_epoch.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
r0, r1 = res["ranks"]
for r in (r0, r1):
    o = orders(r)
    check(len(o) >= 4 and len(set(o)) == 1,
          f"rank {r['rank']}: {len(o)} epochs, {len(set(o))} distinct order(s); epoch sampler.epoch values "
          f"{[s['epoch'] for s in r['sampler_iters']]}; first indices {list(o[0][:6])}", fail)
finish(fail)
