"""What `sanitize` removes from printed results so they compare equal on any machine, and
what it keeps."""
from ddp_lab.launching.sanitize import sanitize


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
