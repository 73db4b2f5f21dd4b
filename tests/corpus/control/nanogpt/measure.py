"""Check correct.py (eager and --compile=True) trains, keeps ranks identical, checkpoints clean keys and
resumes; the bug: under --compile=True the checkpoint's keys carry _orig_mod. and the resume fails."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []
GA = 2  # micro-steps per rank (gradient_accumulation_steps 4 // world size 2)


def model_keys(rec):
    return [list(s["structure"]["model"].keys()) for s in rec["saves"]]


for args in ([], ["--compile=True"]):
    print("correct.py", *args)
    res = run(os.path.join(HERE, "correct.py"), args, timeout=240)
    check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
    r0, r1 = res["ranks"]
    a, b = first_last([sum(s["losses"]) for s in r0["steps"]])
    check(len(r0["steps"]) == 14 and b < 0.85 * a, f"14 steps, loss {a:.3f} -> {b:.3f}", fail)
    same = all(x["param_sum"] == y["param_sum"] for x, y in zip(r0["steps"], r1["steps"]))
    check(same and max_rank_diff(res) == 0.0, "ranks' parameters identical after every step", fail)
    keys = model_keys(r0)
    check(keys and not any(k.startswith("_orig_mod.") for ks in keys for k in ks),
          f"{len(keys)} checkpoints, model keys clean (e.g. {keys[0][0]})", fail)
    top = sorted(r0["saves"][0]["structure"].keys())
    check(top == sorted(["model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"]),
          f"checkpoint holds {top}", fail)
    check(all(l["ok"] for r in (r0, r1) for l in r["loads"]) and len(r1["loads"]) == 1,
          "the restarted job loads the checkpoint on both ranks", fail)
    # what the log line shows vs the true mean loss of the step
    logged, true = [], []
    for s0, s1 in zip(r0["steps"], r1["steps"]):
        logged.append(s0["losses"][-1] * GA)
        true.append(sum(s0["losses"] + s1["losses"]) / 2)
    gap = max(abs(x - y) for x, y in zip(logged, true))
    print(f"  info logged loss (rank 0's last micro-batch x {GA}) vs mean over all micro-batches of both ranks: "
          f"max gap {gap:.4f} over {len(true)} steps")

print("bug_orig_mod_keys.py --compile=True")
res = run(os.path.join(HERE, "bug_orig_mod_keys.py"), ["--compile=True"], timeout=240)
check(res["rc"] != 0, f"the run fails (rc={res['rc']})", fail)
r0, r1 = res["ranks"]
keys = model_keys(r0)
n_bad = sum(1 for k in keys[0] if k.startswith("_orig_mod."))
check(n_bad == len(keys[0]) > 0, f"{len(keys)} checkpoints; {n_bad}/{len(keys[0])} model keys start with _orig_mod. "
      f"(e.g. {keys[0][0]})", fail)
for r in (r0, r1):
    check(r["exc"] is not None and "_orig_mod." in r["exc"] and "Missing key" in r["exc"],
          f"rank {r['rank']}: the resume's load_state_dict raises: " + r["exc"].splitlines()[0][:70]
          + " / Unexpected key(s) in state_dict: _orig_mod.* ", fail)
print("bug_orig_mod_keys.py (eager)")
res = run(os.path.join(HERE, "bug_orig_mod_keys.py"), [], timeout=240)
print(f"  info without --compile the variant behaves like correct.py: rc={res['rc']}, keys "
      f"{model_keys(res['ranks'][0])[0][0]}")
finish(fail)
