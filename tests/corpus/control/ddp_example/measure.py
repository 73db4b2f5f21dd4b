"""Check correct.py: loss goes down, ranks stay identical, the checkpoint reloads on every rank."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []
print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
r0, r1 = res["ranks"]
basic = [l for s in r0["steps"][:12] for l in s["losses"]]
a, b = first_last(basic, 2)
check(b < 0.6 * a, f"demo_basic loss goes down: {a:.3f} -> {b:.3f} over 12 steps", fail)
ck = [l for s in r0["steps"][12:] for l in s["losses"]]
check(len(r0["steps"]) == 20, f"20 optimizer steps (got {len(r0['steps'])})", fail)
print(f"  info demo_checkpoint losses {[round(x, 3) for x in ck]}")
same = all(abs(x["param_sum"] - y["param_sum"]) == 0 for x, y in zip(r0["steps"], r1["steps"]))
check(same, "ranks' parameter sums identical after every step", fail)
check(max_rank_diff(res) == 0.0, f"final parameters identical (max diff {max_rank_diff(res)})", fail)
check(all(l["ok"] for r in (r0, r1) for l in r["loads"]) and len(r1["loads"]) == 1,
      f"every rank loads the checkpoint ({[l['kwargs'] for l in r1['loads']]})", fail)
check(len(r0["saves"]) == 1 and not r1["saves"], "only rank 0 saves", fail)
finish(fail)
