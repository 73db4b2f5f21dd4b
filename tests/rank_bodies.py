"""Per-rank bodies for the launcher tests (importable, so ranks can load them by reference)."""
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def add_ranks(offset=0):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "sum": t.item() + offset, "env": {
        k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}}


def raise_on_rank(rank=1):
    if dist.get_rank() == rank:
        torch.zeros(3)[7]  # a real IndexError from torch
    t = torch.ones(1)
    dist.all_reduce(t)


def all_reduce_on_rank0_only():
    t = torch.ones(1)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        time.sleep(60)


def exit_3_on_rank1():
    if dist.get_rank() == 1:
        os._exit(3)
    return "survived"


def sigkill_rank1():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return "survived"


def write_10mb():
    chunk = "x" * 1023 + "\n"
    for _ in range(10 * 1024):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    os.write(2, b"fd-level stderr\n")
    return "done"


def return_unpicklable():
    import threading

    return threading.Lock()


def start_grandchild_and_hang():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(f"grandchild {proc.pid}", flush=True)
    time.sleep(120)


def start_grandchild_and_return():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return proc.pid


def read_env(*names):
    return {n: os.environ.get(n) for n in names}


def temporary_folder():
    import tempfile

    return tempfile.gettempdir()


def debug_level():
    return str(dist.get_debug_level())


def no_group():
    return dist.is_initialized()


def slow_then_ok(seconds=0.5):
    time.sleep(seconds)
    return "ok"


def write_pid_and_hang(folder):
    with open(os.path.join(folder, f"rank{dist.get_rank()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


def return_an_exception():
    return KeyError("type")


def set_up_then_sleep(setup=2.0, then=1.5):
    """A long set-up, the clock restarted, then less than the timeout: ok only because the
    set-up's seconds no longer count."""
    from ddp_lab.launching.rankinfo import restart_clock

    time.sleep(setup)
    restarted = restart_clock()
    time.sleep(then)
    return restarted


def set_up_then_hang(setup=2.0, budget=1.0):
    """A set-up longer than the hang's budget, then a hang: stopped `budget` s after it."""
    from ddp_lab.launching.rankinfo import restart_clock

    time.sleep(setup)
    restart_clock(budget)
    time.sleep(60)


def return_while_peer_reduces():
    """Rank 1 returns at once; rank 0 all-reduces, with no partner left."""
    if dist.get_rank() == 0:
        t = torch.ones(4)
        dist.all_reduce(t)
    return dist.get_rank()


def reduce_four_and_three():
    """Both ranks all-reduce once, rank 0 four numbers, rank 1 three: rank 1 returns."""
    t = torch.ones(4 - dist.get_rank())
    dist.all_reduce(t)
    return dist.get_rank()


def private_torch_names() -> dict:
    """What the course reads through torch's private names, read on this torch in a rank (a
    process group of its own): DDP's list of the module's parameters made at wrapping, and the
    default group's store. None where the name is missing."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(2, 2)
    ddp = DDP(model)
    listed = getattr(ddp, "_module_parameters", None)
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    store = get_store() if get_store else None
    if store is not None:
        store.set("private-names", "1")
    return {"_module_parameters": None if listed is None else
            [id(p) for p in listed] == [id(p) for p in model.parameters()],
            "_get_default_store": None if store is None else store.get("private-names") == b"1"}


def make_a_folder_then_hang():
    """A folder of the rank's own in the launch's scratch folder, a file in it, then a hang: the
    launcher kills the rank, which never removes it."""
    import tempfile

    from ddp_lab.launching.rankinfo import scratch_dir

    folder = tempfile.mkdtemp(prefix="ddp-lab-body-", dir=scratch_dir())
    open(os.path.join(folder, "data"), "w").close()
    print(folder, flush=True)
    while True:
        time.sleep(0.05)
