"""Every way a script starts its default process group in torch 2.13 is watched (issue 44).

Read from torch/distributed/distributed_c10d.py: the default group is set in one place,
`init_process_group` (its `_update_default_pg(default_pg)`), reached by the public name
(`dist.init_process_group`, tests in test_script_mode.py), by the name device_mesh.py imported
(`init_device_mesh`, and `DeviceMesh(...)` made directly: `_setup_world_group_and_device`), and by
FSDP2's `fully_shard` given no mesh (`_init_default_mesh`: `dist.distributed_c10d.init_process_group()`).
A script that starts none is refused with exit status 2 (test_script_mode.py)."""
import textwrap

import pytest

from ddp_lab.doctor.watch.script import watch_script

pytestmark = pytest.mark.usefixtures("no_leftovers")

LOOP = """
opt = torch.optim.SGD(params, lr=0.1)
for _ in range(2):
    loss = sum(p.sum() for p in params)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""
STARTS = {
    "init_device_mesh": ("from torch.distributed.device_mesh import init_device_mesh\n"
                         "mesh = init_device_mesh('cpu', (2,))\n"
                         "params = [torch.nn.Parameter(torch.ones(2))]\n"),
    "DeviceMesh": ("from torch.distributed.device_mesh import DeviceMesh\n"
                   "mesh = DeviceMesh('cpu', [0, 1])\n"
                   "params = [torch.nn.Parameter(torch.ones(2))]\n"),
    "fully_shard": ("from torch.distributed.fsdp import fully_shard\n"
                    "model = torch.nn.Linear(4, 4)\n"
                    "fully_shard(model)\n"
                    "params = list(model.parameters())\n"),
}


@pytest.mark.parametrize("how", sorted(STARTS))
def test_a_script_that_starts_its_group_without_init_process_group_is_watched(tmp_path, how):
    path = tmp_path / "train.py"
    path.write_text("import torch\n" + STARTS[how] + textwrap.dedent(LOOP))
    report = watch_script(str(path), timeout=30)
    assert report.status == "ok" and report.steps == 2, report.text()
    starts = next(n for n, text in enumerate(path.read_text().splitlines(), 1)
                  if text.startswith(("mesh = ", "fully_shard(")))
    for rec in report.evidence.ranks:  # the user's line that started it
        assert rec["group"]["line"].startswith(f"train.py:{starts}: "), rec["group"]
    assert not report.errors and not report.warnings, report.text()
