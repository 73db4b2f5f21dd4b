"""The instructor guide's prose: the questions attendees ask at each lesson (with answers), the
problems their machines hit (with fixes), and how to run the course on a GPU node. The figures
and the agendas are computed by `ddp_lab.guide` from the notebooks themselves."""

QUESTIONS: dict[str, list[tuple[str, str]]] = {
    "00": [
        ("Why processes and not threads?",
         "Each rank is its own interpreter with its own GIL (and, on a GPU, its own CUDA context), "
         "exactly as under `torchrun`. `ddp_lab` starts fresh processes from a clean fork server; "
         "it never forks the notebook."),
        ("Only rank 0's code raised; why does rank 1 show an error too?",
         "Rank 1 was waiting for rank 0 in a collective; when rank 0 died its connection closed "
         "(gloo: \"Connection closed by peer\"). Read the root-cause rank first: the table marks it."),
        ("What are MASTER_ADDR and MASTER_PORT?",
         "Where the rendezvous store listens. `torchrun` sets them; `ddp_lab.launch` hosts the store "
         "itself on a free port and sets the same variables."),
    ],
    "01": [
        ("Why does DDP not synchronise my tensor?",
         "DDP all-reduces the gradients of `module.parameters()` only. A tensor with `requires_grad` "
         "kept as a plain attribute, or sub-modules in a Python list, are invisible to it: use "
         "`nn.Parameter`, `nn.ModuleList`/`ModuleDict`, `nn.ParameterList`."),
        ("Can I just pass `find_unused_parameters=True`?",
         "It removes the error at the cost of a traversal of the autograd graph every step. Remove "
         "or use the parameter when it is never used; keep the flag for parameters that are used on "
         "some steps only."),
        ("DataParallel or DistributedDataParallel?",
         "DDP: one process per device. DataParallel is one process with threads, replicates the "
         "module on every forward and is slower; PyTorch recommends DDP even on one machine."),
    ],
    "02": [
        ("Why did `.to(device)` leave my tensor behind?",
         "`.to()` moves registered parameters and buffers only. Register the constant with "
         "`register_buffer` (`persistent=False` keeps it out of the `state_dict`)."),
        ("How do I create a tensor inside `forward`?",
         "On the input's device and dtype: `x.new_zeros(...)`, `torch.zeros_like(x)` or "
         "`torch.zeros(..., device=x.device, dtype=x.dtype)`."),
        ("What goes in `device_ids`?",
         "`[local_rank]` for a module on one GPU; `None` for a CPU module (or a multi-device one)."),
    ],
    "03": [
        ("Why a hang and not an error?",
         "A gloo collective blocks until every rank of the group calls it. A rank that never calls "
         "leaves the others waiting until the process group's timeout; the lesson's launch timeout "
         "turns that into a report with every rank's stack."),
        ("How do I find the rank that never came?",
         "`dist.monitored_barrier()` (gloo) names it; on a real job, dump each rank's stack "
         "(`py-spy dump --pid`, or `faulthandler`) and compare where they wait."),
        ("Is NCCL the same?",
         "NCCL collectives return once queued; the hang shows at the next synchronisation "
         "(`.item()`, `cuda.synchronize()`) or as the NCCL watchdog's abort."),
    ],
    "04": [
        ("Do I need a GradScaler with bfloat16?",
         "No: bfloat16 has float32's exponent range, so small gradients do not underflow. "
         "GradScaler is for float16."),
        ("Why does my custom autograd Function fail under autocast?",
         "Its `forward` sees autocast's mixed dtypes and its `backward` runs outside autocast. "
         "Decorate them with `torch.amp.custom_fwd(device_type=...)` and `torch.amp.custom_bwd`."),
        ("`torch.cuda.amp` warns that it is deprecated.",
         "Use `torch.amp.autocast(\"cuda\")` and `torch.amp.GradScaler(\"cuda\")`: same behaviour."),
    ],
    "05": [
        ("Why \"Trying to backward through the graph a second time\"?",
         "Backward frees the tensors it saved. `retain_graph=True` keeps them but usually hides a "
         "tensor carried across steps: `detach()` it instead."),
        ("Which checkpointing should I use under DDP?",
         "`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, which PyTorch recommends; "
         "the reentrant form conflicts with DDP's gradient hooks unless `static_graph=True`."),
        ("What is \"modified by an inplace operation\"?",
         "A tensor autograd saved for backward was changed in place; `clone()` it first or use the "
         "out-of-place op."),
    ],
    "06": [
        ("How do I print once instead of N times?",
         "Guard with `if rank == 0`, or give each rank its own log file; plain prints from ranks "
         "interleave."),
        ("What does `TORCH_DISTRIBUTED_DEBUG` do?",
         "`INFO` makes DDP log more and name unused parameters in its error; `DETAIL` also checks "
         "that ranks call matching collectives. On this build (torch 2.13 CPU) `DETAIL` set before "
         "the process group is created crashes DDP: the lesson shows it."),
        ("Which rank failed first?",
         "The launcher orders failures by time; ranks that only lost their peer are shown as "
         "consequences."),
    ],
    "07": [
        ("Why does every rank see the same batches?",
         "Without `DistributedSampler` each rank iterates the whole dataset: N ranks do the same "
         "epoch N times."),
        ("What does `set_epoch` change?",
         "The sampler's shuffle seed: without it every epoch has the same order."),
        ("One rank has fewer batches and the job hangs.",
         "The others wait in DDP's all-reduce. Use `drop_last=True` or `model.join()` (`Join`)."),
    ],
    "08": [
        ("Does DDP synchronise buffers?",
         "With `broadcast_buffers=True` (the default) rank 0's buffers overwrite the others' at the "
         "start of each forward, so BatchNorm's running statistics are rank 0's alone."),
        ("When do I need SyncBatchNorm?",
         "When each rank's batch is small: `nn.SyncBatchNorm.convert_sync_batchnorm(model)` computes "
         "the statistics over all ranks."),
    ],
    "09": [
        ("Which rank saves?",
         "Rank 0 only, then a `dist.barrier()` before any rank loads the file."),
        ("Loading fails with unexpected `module.` keys.",
         "The DDP wrapper prefixes names: save `model.module.state_dict()`, or load before wrapping."),
        ("How do I load a GPU checkpoint on another device?",
         "`torch.load(path, map_location=device)`."),
    ],
    "10": [
        ("Why `no_sync`?",
         "Under DDP every backward all-reduces. For k micro-batches, run the first k-1 backwards "
         "inside `model.no_sync()`: one all-reduce per optimiser step."),
        ("Do I divide the loss?",
         "By k, so the accumulated gradient is the mean over the micro-batches."),
    ],
    "11": [
        ("Does the doctor replace my tests?",
         "No: it runs your module for a few steps on real ranks with the input you give and finds "
         "the course's error classes, not every bug."),
        ("My model only runs on a GPU.",
         "Run the doctor on the GPU node: it uses NCCL when there is a GPU per rank."),
    ],
}

NO_QUESTIONS = "No questions collected for this lesson yet: write down the ones attendees ask."

MACHINE_PROBLEMS: list[tuple[str, str, str]] = [
    ("Root in a container (Docker, some cloud notebooks)",
     "`jupyter lab` refuses to start: \"Running as root is not recommended. Use --allow-root to bypass.\"",
     "`jupyter lab --allow-root --no-browser --ip 0.0.0.0 notebooks/` inside the container, and "
     "publish the port (`docker run -p 8888:8888 ...`); or run as a normal user."),
    ("Windows without WSL",
     "The course is tested on Linux and macOS: the launcher starts ranks from a POSIX fork server "
     "and stops them by process group, which native Windows lacks.",
     "Install WSL 2 (`wsl --install`, Ubuntu) and follow the README inside it, or use Binder."),
    ("A corporate proxy",
     "`pip install` times out, or cannot reach `download.pytorch.org` (the CPU wheel index).",
     "Set `HTTPS_PROXY=http://proxy:port` (or `pip --proxy`) before the first command; ask for "
     "`download.pytorch.org` to be allowed; set `NO_PROXY=localhost,127.0.0.1` so the browser "
     "reaches JupyterLab directly. Binder needs no install at all."),
    ("A 2-core laptop",
     "The notebooks were measured on 2 cores: each runs 2 ranks, and the first launch of a session "
     "imports torch (a few seconds). A busy laptop makes runs slower, not different.",
     "Close other heavy programs; keep the panels' world size at 2; run `ddp-lab check` first: "
     "its launch time says how the day will feel."),
    ("DeepSpeed's op not built (lesson 12)",
     "`ddp-lab check` fails its `deepspeed` line; lesson 12's ZeRO-3 runs fail on every rank with "
     "`OpBuildError` naming `ddp-lab build-ops` (a rank never compiles the op itself).",
     "Run `ddp-lab build-ops` once before the day (a few minutes, then instant). It needs a C++ "
     "compiler and the Python headers: `apt-get install g++ python3-dev` (Debian/Ubuntu), "
     "`xcode-select --install` (macOS); `ddp-lab check` names whichever is missing."),
    ("A multi-GB download",
     "`pip install torch` without the CPU index pulls the CUDA build on Linux.",
     "Install from `requirements.txt`, which names the CPU index."),
]

GPU_NODE = """\
The same notebooks run on a GPU node with NCCL; nothing in them is CPU-only.

- Install the CUDA build of torch 2.13.0 first (PyTorch's install selector gives the command for
  the node's driver), then `pip install -r requirements.txt`: its `torch==2.13.0` is already
  satisfied by the CUDA build, which it keeps.
- `backend="auto"` (the default everywhere) picks NCCL when the node has a GPU per rank, gloo
  otherwise. To insist: `ddp_lab.launch(fn, world_size=2, backend="nccl")`,
  `scenario.run("broken", backend="nccl")`, `%%ddp -n 2 --backend nccl`; NCCL with too few GPUs is
  refused with a message naming how many are visible.
- Rank code takes its device from `ddp_lab.device()` (`cuda:<local rank>` under NCCL).
- What differs, and what to say: NCCL collectives return once queued, so lesson 03's hangs show
  at the next synchronisation or as the watchdog's abort rather than inside the collective;
  messages are NCCL's, not gloo's. The committed outputs are the CPU/gloo run's, so on a GPU node
  run the notebooks as lessons, not under `pytest --nbval`.
- `ddp-lab check` on the node reports the CUDA build and the number of GPUs.
"""

SHARED_NODE = """\
Every attendee a user of one machine: what separates them, and what does not. Run `ddp-lab
check` as each attendee: its `users` line warns when other users are on the machine.

What is theirs alone:
- Each launch keeps its specs (the pickled function and arguments each rank loads), the ranks'
  output and their stacks in a folder made by `tempfile.mkdtemp`: mode 0700, owned by the
  attendee, under a name nobody can guess, removed when the launch ends. The lessons that write
  files (06, 09, 13, 16, 17) and `watch` put them in such folders too.
- The notebook talks to its fork server over a socketpair: no file, no port.
- Each attendee starts their own JupyterLab, which asks for its token.

What is shared:
- The rendezvous store. A launch hosts torch's `TCPStore` on 127.0.0.1, on a port the kernel
  picks: not reachable from another machine, and never the same port twice at once, but any
  user of this machine can connect to it, and the store has no password (torch 2.13's `TCPStore`
  takes none). Someone who finds the port (every user sees which ports listen) can read and
  write a running job's keys: make a lesson's run fail or hang, or see what the ranks exchange
  through the store (the course puts nothing private there). Fine for a workshop of people who trust each other; not
  a place for private data or models.
- gloo's own connections between the ranks. Each rank listens on a port the kernel picks, at
  the address the machine's host name resolves to (loopback only when the name does not
  resolve): on a node whose name resolves to its network address, other machines can reach
  them too. `export GLOO_SOCKET_IFNAME=lo` before starting JupyterLab keeps them on loopback
  (the ranks inherit the environment).
- The cores and the memory. The launcher gives each rank `cores // world size` threads of the
  whole machine, not of an attendee's share: twenty attendees running two ranks each make every
  run slower (never different), and lesson 18's timings vary the most. Limit each attendee's
  cores (cgroups, `taskset`) or stagger the runs.
- The GPUs. Rank r uses `cuda:r`, so every attendee's rank 0 lands on GPU 0: give each
  attendee their own `CUDA_VISIBLE_DEVICES` before JupyterLab starts.
"""
