"""Check correct.py (both checkpoint APIs) trains and resumes exactly; the bug: layers garbage/NaN from step 0."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []

for args in ([], ["--dcp-api"]):
    print("correct.py", *args)
    res = run(os.path.join(HERE, "correct.py"), args)
    check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
    for r in res["ranks"]:
        init = [s for s in r["steps"] if not s["losses"]]
        st = [s for s in r["steps"] if s["losses"]]
        check(len(init) == 1 and init[0]["delta"] == 0.0,
              f"rank {r['rank']}: resume's optimizer-state init makes {len(init)} zero-lr step(s), "
              f"parameter change {[s['delta'] for s in init]}", fail)
        ls = [l for s in st for l in s["losses"]]
        a, b = first_last(ls, 2)
        check(len(st) == 12 and b < 0.6 * a, f"rank {r['rank']}: 12 steps, loss {a:.3f} -> {b:.3f}", fail)
        check(all(s["nonfinite"] == 0 and s["pre_nonfinite"] == 0 for s in st), "no non-finite parameter", fail)
        gap = abs(r["steps"][7]["pre_param_sum"] - r["steps"][5]["param_sum"])
        check(gap < 1e-4, f"rank {r['rank']}: the resumed job starts from the saved shard (|sum diff| {gap:.2e})", fail)
        check(st[6]["losses"][0] < st[0]["losses"][0] - 0.5,
              f"rank {r['rank']}: resumed loss {st[6]['losses'][0]:.3f} continues from {st[5]['losses'][0]:.3f}", fail)
    print(f"  info rank 0 loads: {[(os.path.basename(l['path']), l['ok']) for l in res['ranks'][0]['loads']]}")

print("bug_layers_not_initialised.py")
res = run(os.path.join(HERE, "bug_layers_not_initialised.py"))
print(f"  info rc={res['rc']}")
for r in res["ranks"]:
    st = r["steps"]
    s0 = st[0]
    nan_losses = sum(1 for s in st for l in s["losses"] if math.isnan(l))
    st = [s for s in st if s["losses"]]
    check(s0["pre_nonfinite"] > 0 or s0["pre_absmax"] > 1e6,
          f"rank {r['rank']}: before the first step {s0['pre_nonfinite']}/{s0['numel']} local parameter values "
          f"non-finite, largest finite |value| {s0['pre_absmax']:.3g}", fail)
    check(nan_losses == len(st), f"rank {r['rank']}: loss NaN at {nan_losses}/{len(st)} steps (from step 0)", fail)
    print(f"  info rank {r['rank']} non-finite after each step: {[s['nonfinite'] for s in st]}")
finish(fail)
