"""What `sanitize` removes from printed results so they compare equal on any machine, and
what it keeps."""
from ddp_lab.launching.sanitize import library_file, sanitize


def test_installed_packages_lose_the_machines_prefix():
    text = ('File "/home/u/proj/.venv/lib/python3.11/site-packages/deepspeed/utils/nvtx.py", '
            "line 33 in wrapped_fn; /usr/lib/python3/dist-packages/numpy/core/x.py")
    assert sanitize(text) == ('File "deepspeed/utils/nvtx.py" in wrapped_fn; '
                              "numpy/core/x.py")


def test_libraries_lose_their_line_numbers_the_course_and_the_learner_keep_theirs():
    """torch's, another package's and Python's own line numbers change with each release: a
    traceback, a faulthandler stack, a warning and a C++ source lose them, keeping the file and
    the function. The course's files (editable or installed) and the learner's keep theirs."""
    from ddp_lab.launching.frames import place
    from ddp_lab.lessons.l01_parameter_registration import runs
    from ddp_lab.lessons.l02_device_and_dtype import modules

    venv = "/home/u/.venv/lib/python3.11/site-packages"
    runs_py, modules_py = place(runs), place(modules)
    text = "\n".join([
        f'  File "{venv}/torch/_tensor.py", line 623, in backward',
        f'  File "{venv}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce',
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        f'  File "{venv}/{runs_py}", line 55, in train',
        f'  File "/home/u/ddp-lab/{modules_py}", line 9, in f',
        '  File "/tmp/ipykernel_812/2157.py", line 3, in <module>',
        '  File "<%%ddp cell>", line 2, in <module>',
        f"{venv}/torch/distributed/fsdp/_fully_shard/_fsdp_state.py:331: UserWarning: FSDP2",
        f"W1204 16:14:01.033000 1552 {venv}/torch/utils/cpp_extension.py:183] No CUDA runtime",
        "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Read error",
        "Exception raised from run at /pytorch/torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:1017",
    ])
    assert sanitize(text).splitlines() == [
        '  File "torch/_tensor.py", in backward',
        '  File "torch/distributed/distributed_c10d.py" in all_reduce',
        '  File "<frozen runpy>", in _run_module_as_main',
        f'  File "{runs_py}", line 55, in train',
        f'  File "{modules_py}", line 9, in f',
        '  File "/tmp/ipykernel_812/2157.py", line 3, in <module>',
        '  File "<%%ddp cell>", line 2, in <module>',
        "torch/distributed/fsdp/_fully_shard/_fsdp_state.py: UserWarning: FSDP2",
        "W<time> torch/utils/cpp_extension.py] No CUDA runtime",
        "RuntimeError: [third_party/gloo/gloo/transport/tcp/pair.cc] Read error",
        "Exception raised from run at torch/csrc/distributed/c10d/ProcessGroupGloo.cpp",
    ]
    assert sanitize(sanitize(text)) == sanitize(text)


def test_the_standard_library_is_a_library():
    import threading

    assert library_file(threading.__file__) and not library_file("/home/u/train.py")


def test_torch_paths_addresses_and_pids_are_blanked_the_rest_kept():
    text = ("/opt/conda/lib/python3.11/torch/distributed/c10d.py at 127.0.0.1:29500, "
            "object at 0x7f3a2b1c4d50, pid 12345, all_reduce #3 of [4] float32")
    assert sanitize(text) == ("torch/distributed/c10d.py at <addr>, object at 0x…, pid <pid>, "
                              "all_reduce #3 of [4] float32")


def test_c10d_ports_are_blanked_the_host_kept():
    text = ("The server socket has failed to listen on any local network address. port: 35731, "
            "useIpv6: false; trying to connect to (192.0.2.1, 35829). shapes (4, 3) of rank (0, 1)")
    assert sanitize(text) == ("The server socket has failed to listen on any local network address. "
                              "port: <port>, useIpv6: false; trying to connect to (192.0.2.1, <port>). "
                              "shapes (4, 3) of rank (0, 1)")


def test_a_course_file_that_torch_shortened_is_named_from_the_course_on():
    """Dynamo's guard comments name a frame with torch's `shorten_filename`
    (torch/utils/_traceback.py:133), which cuts the path at the folder the file shares with
    torch's install: where the venv lives decides what is left (issue 38, point 2). Whatever it
    left, the printed path is the course-relative one."""
    from torch.utils._traceback import shorten_filename

    from ddp_lab.launching.frames import place
    from ddp_lab.lessons.l15_compile import modules

    course = place(modules)
    cut = {}
    for checkout, venv in (("/work/main", "/work/main/.venv"),  # the venv inside the checkout
                           ("/work/main", "/opt/venv"),  # only "/" shared
                           ("/tmp/l15clone", "/work/main/.venv"),
                           ("/home/u/ddp-lab", "/home/u/.venv")):
        torch_dir = f"{venv}/lib/python3.11/site-packages/torch"
        short = shorten_filename(f"{checkout}/{course}", base=torch_dir)
        cut[checkout, venv] = short
        guard = (f"- self._modules['gate'].calls == 0    # self.calls += 1  # {short}:40 in forward"
                 " (HINT: torch.compile considers integer attributes)")
        assert sanitize(guard) == (f"- self._modules['gate'].calls == 0    # self.calls += 1  "
                                   f"# {course}:40 in forward (HINT: torch.compile considers "
                                   "integer attributes)")
    # what torch really prints in these places: the test covers the cuts the issue saw
    assert cut["/work/main", "/work/main/.venv"] == course
    assert cut["/work/main", "/opt/venv"] == f"ork/main/{course}"
    assert cut["/tmp/l15clone", "/work/main/.venv"] == f"mp/l15clone/{course}"
    assert cut["/home/u/ddp-lab", "/home/u/.venv"] == f"ddp-lab/{course}"


def test_relative_paths_that_are_not_cut_from_a_file_of_ours_stay():
    text = "nn/modules/module.py:1773 in _call_impl; and/or tensor/shape; ddp_lab_x/y"
    assert sanitize(text) == "nn/modules/module.py:1773 in _call_impl; and/or tensor/shape; ddp_lab_x/y"
