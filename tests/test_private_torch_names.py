"""The private torch names the course reads, checked on the torch in use (issue 47): in the suite
on the pinned torch, and in the upgrade check's environment on the newest one
(tools/upgrade_check.py runs this file with --ci). A release that renames or drops one fails
here, by name, before a lesson fails for a reason it cannot say."""
import rank_bodies as body
from ddp_lab import launch
from ddp_lab.lessons import l19_drift_nobody_reports as l19

# name -> (what the course reads it for, where)
PRIVATE = {
    "_module_parameters": ("DistributedDataParallel's list of the module's parameters at wrapping "
                           "(torch/nn/parallel/distributed.py:895-899 in 2.13)", l19.unregistered),
    "_get_default_store": ("torch.distributed.distributed_c10d's store of the default group, the "
                           "ranks' meeting point", l19.read_async),
}


def test_the_private_torch_names_the_course_reads_are_there():
    result = launch(body.private_torch_names, world_size=1, backend="gloo", timeout=60)
    result.raise_for_status()
    found = result.values[0]
    assert set(found) == set(PRIVATE)
    broken = [f"{name} ({what}), read by {fn.__module__}.{fn.__name__}: "
              f"{'missing' if found[name] is None else 'not what it was'}"
              for name, (what, fn) in PRIVATE.items() if found[name] is not True]
    assert not broken, "this torch changed a private name the course reads: " + "; ".join(broken)
