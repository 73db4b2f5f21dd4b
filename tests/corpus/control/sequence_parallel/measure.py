"""Check correct.py trains; no_zero_grad: gradients grow across steps; optimizer_before_parallelize: nothing moves."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []


def gnorms(r):
    return [round(s["grad_norm"], 3) for s in r["steps"]]


print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
for r in res["ranks"]:
    a, b = first_last([l for s in r["steps"] for l in s["losses"]])
    check(b < 0.5 * a, f"rank {r['rank']}: loss {a:.3f} -> {b:.3f}", fail)
    g = gnorms(r)
    check(max(g[-4:]) < 2 * max(g[:4]), f"rank {r['rank']}: grad norms stay bounded {g}", fail)
    check(all(s["delta"] > 0 for s in r["steps"]), "every step changes the parameters", fail)
l0 = [l for s in res["ranks"][0]["steps"] for l in s["losses"]]
l1 = [l for s in res["ranks"][1]["steps"] for l in s["losses"]]
check(l0 != l1, "ranks see different sequence shards (different local losses)", fail)

print("bug_no_zero_grad.py")
res = run(os.path.join(HERE, "bug_no_zero_grad.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
for r in res["ranks"]:
    g = gnorms(r)
    grow = sum(1 for x, y in zip(g, g[1:]) if y > x)
    check(g[-1] > 3 * g[0] and grow >= (len(g) - 1) // 2,
          f"rank {r['rank']}: grad norm grows {g[0]} -> {g[-1]} ({grow}/{len(g) - 1} steps up): {g}", fail)
    a, b = first_last([l for s in r["steps"] for l in s["losses"]])
    print(f"  info rank {r['rank']} loss {a:.3f} -> {b:.3f}")

print("bug_optimizer_before_parallelize.py")
res = run(os.path.join(HERE, "bug_optimizer_before_parallelize.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
for r in res["ranks"]:
    st = r["steps"]
    check(all(s["delta"] == 0.0 and s["n_with_grad"] == 0 for s in st),
          f"rank {r['rank']}: {len(st)} optimizer steps, none of its {st[0]['n_params']} params ever has a grad, "
          f"parameter change per step {sorted(set(s['delta'] for s in st))}", fail)
    ls = [l for s in st for l in s["losses"]]
    a, b = first_last(ls)
    print(f"  info rank {r['rank']} loss {a:.3f} -> {b:.3f}")
finish(fail)
