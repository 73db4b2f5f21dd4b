"""What `sanitize` removes from printed results so they compare equal on any machine, and
what it keeps."""
from ddp_lab._sanitize import sanitize


def test_installed_packages_lose_the_machines_prefix():
    text = ('File "/home/u/proj/.venv/lib/python3.11/site-packages/deepspeed/utils/nvtx.py", '
            "line 33 in wrapped_fn; /usr/lib/python3/dist-packages/numpy/core/x.py")
    assert sanitize(text) == ('File "deepspeed/utils/nvtx.py", line 33 in wrapped_fn; '
                              "numpy/core/x.py")


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
