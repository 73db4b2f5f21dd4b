"""DeepSpeed's op missing from this environment is the environment's error, never a finding about
the user's module (issue 47): `doctor(..., strategy="zero3")` and `watch(..., strategy="zero3")`
raise OpBuildError naming `ddp-lab build-ops` before any rank starts, instead of a rank compiling
the op under the launch's timeout and the report blaming the module (`sharded-run-failed`)."""
import pytest
import torch

from ddp_lab.instruments.deepspeed_ops import COMMAND, OpBuildError
from ddp_lab.launching.cuda_init import gpu_count

pytestmark = pytest.mark.skipif(gpu_count() > 0, reason="on GPUs ZeRO-3 needs no CPU op")


@pytest.fixture
def no_op_here(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a folder where nothing is built


def _step(model, batch, step):
    loss = model(batch).sum()
    model.backward(loss)
    model.step()
    return loss


def test_the_doctor_refuses_before_launching(no_op_here):
    from ddp_lab.doctor import doctor

    with pytest.raises(OpBuildError, match=COMMAND):
        doctor(lambda: torch.nn.Linear(4, 4), torch.randn(2, 4), strategy="zero3")


def test_watch_refuses_before_launching(no_op_here):
    from ddp_lab.watch import watch

    with pytest.raises(OpBuildError, match=COMMAND):
        watch(_step, lambda: torch.nn.Linear(4, 4), lambda rank, step: torch.randn(2, 4), strategy="zero3")
