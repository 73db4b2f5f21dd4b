"""Check correct.py trains with ranks identical and its GPTConfig checkpoint reloads (weights_only=False);
the bug: require_backward_grad_sync set after the forward, so ranks' parameters part."""
import importlib.util
import io
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "_probe"))
from common import check, finish, first_last, max_rank_diff, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
fail = []


def param_gap(res):
    return [abs(x["param_sum"] - y["param_sum"]) for x, y in zip(res["ranks"][0]["steps"], res["ranks"][1]["steps"])]


print("correct.py")
res = run(os.path.join(HERE, "correct.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']}, {res['seconds']:.1f}s)", fail)
r0, r1 = res["ranks"]
a, b = first_last([sum(s["losses"]) for s in r0["steps"]])
check(len(r0["steps"]) == 12 and b < 0.9 * a, f"12 steps, rank 0 loss {a:.3f} -> {b:.3f}", fail)
check(max(param_gap(res)) == 0.0 and max_rank_diff(res) == 0.0, "ranks' parameters identical after every step", fail)
st = r0["saves"][0]["structure"]
check(sorted(st) == ["config", "model", "step", "val_loss"] and st["config"] == "GPTConfig",
      f"checkpoint holds {sorted(st)} with config a {st['config']}", fail)
ld = r0["loads"]
check(len(ld) == 1 and ld[0]["ok"] and ld[0]["kwargs"].get("weights_only") == "False",
      f"the script reloads its checkpoint with {ld[0]['kwargs'] if ld else None}", fail)

# why weights_only=False: the default refuses the dataclass
spec = importlib.util.spec_from_file_location("bn_correct", os.path.join(HERE, "correct.py"))
mod = importlib.util.module_from_spec(spec)
sys.modules["bn_correct"] = mod
spec.loader.exec_module(mod)
buf = io.BytesIO()
torch.save({"model": {}, "config": mod.GPTConfig(), "step": 1, "val_loss": 1.0}, buf)
buf.seek(0)
try:
    torch.load(buf)
    refused = ""
except Exception as e:  # noqa: BLE001
    refused = type(e).__name__
check(refused == "UnpicklingError", f"torch.load's default (weights_only=True) refuses such a checkpoint: {refused}", fail)

print("bug_grad_sync_after_forward.py")
res = run(os.path.join(HERE, "bug_grad_sync_after_forward.py"))
check(res["rc"] == 0, f"exit 0 (rc={res['rc']})", fail)
gap = param_gap(res)
md = max_rank_diff(res)
check(gap[0] > 0 and md > 1e-3,
      f"ranks' parameters part from step 1: |sum diff| step1 {gap[0]:.3g}, step12 {gap[-1]:.3g}; "
      f"final max |diff| {md:.3g}", fail)
a, b = first_last([sum(s["losses"]) for s in res["ranks"][0]["steps"]])
print(f"  info rank 0 loss {a:.3f} -> {b:.3f}")
finish(fail)
