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
