"""Every notebook passes strict nbval with PyTorch's portable CPU kernels as well as with this
machine's own (ATEN_CPU_CAPABILITY=default; the native pass is pytest's own collection of
notebooks/). A printed figure that depends on the instruction set fails here, not on a learner's
laptop. See tests/conftest.py (KernelPass) for how the second pass runs."""
import os
import re

import pytest


def test_notebooks_pass_strict_nbval_with_portable_cpu_kernels(kernel_pass):
    if os.environ.get("DDP_LAB_KERNEL_PASS") == "child":
        pytest.skip("this is the portable-kernel pass itself")
    code, output = kernel_pass.wait()
    summary = output.strip().splitlines()[-1] if output.strip() else "(no output)"
    failed = sorted(set(re.findall(r"^FAILED (\S+)", output, re.M)))
    assert code == 0, (f"strict nbval under ATEN_CPU_CAPABILITY=default: {summary}\n"
                       + "\n".join(failed) + "\n\n" + output[-6000:])
    assert re.search(r"\d+ passed", summary), summary
