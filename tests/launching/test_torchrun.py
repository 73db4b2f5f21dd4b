"""Scenarios under torchrun as two nodes on one machine: two agents, one rank each, a c10d
rendezvous on localhost. There RANK and LOCAL_RANK differ (rank 1 is local rank 0 of node 1),
the case multi-node code must handle, and both agents must exit 0 (no abort at teardown)."""
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(*cli_args, timeout=90):
    """Run `python -m ddp_lab ...` under two torchrun agents; [(returncode, stdout, stderr)]."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "ddp-lab-test",
         "--node-rank", str(node), "-m", "ddp_lab", *cli_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for node in (0, 1)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in agents]
        return [(p.returncode, *out) for p, out in zip(agents, outputs)]
    finally:
        for p in agents:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_scenario_runs_as_two_nodes_where_rank_and_local_rank_differ():
    (code0, out0, err0), (code1, out1, err1) = two_nodes("run", "00", "source_example",
                                                         "--variant", "fixed")
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    lines = (out0 + out1).splitlines()
    assert "[rank 0] 00/source_example fixed: ok ok" in lines
    assert "[rank 1] 00/source_example fixed: ok ok (local rank 0)" in lines
