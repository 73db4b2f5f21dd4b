"""`ddp-lab doctor path/to/file.py:Name --input ...`: exit statuses 0 / 1 / 2, text and JSON.

Most tests call the CLI in this process (`main([...])`); one runs the installed `ddp-lab`
command as a user would, and times it on a 10-layer module."""
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddp_lab.doctor.cli import main

MODULES = textwrap.dedent('''
    import torch
    from torch import nn

    class TenLayers(nn.Module):
        def __init__(self, width=64):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(10))

        def forward(self, x):
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = nn.Linear(16, 4), nn.Linear(16, 4)

        def forward(self, x):
            return self.used(x)

    class NoParams(nn.Module):
        def forward(self, x):
            return x * 2

    def make_unused():
        return Unused()

    def broken_factory():
        raise RuntimeError("CUDA is not available here")

    def batch(rank):
        return torch.randn(8, 16) + rank
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("doctor") / "models.py"
    path.write_text(MODULES)
    return path


def doctor_cli(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_clean_module_exits_0(models, capsys):
    status, out, _ = doctor_cli(capsys, f"{models}:TenLayers", "--input", "torch.randn(32, 64)")
    assert status == 0
    head, *notes = out.strip().splitlines()
    assert head == "doctor: TenLayers (world size 2, 3 steps, ranks ok): no findings"
    assert notes[0].startswith("  loss: the default") and "not exercised:" in out


def test_errors_exit_1_and_json_has_the_findings(models, capsys):
    status, out, _ = doctor_cli(capsys, f"{models}:make_unused", "--input", "batch", "--json")
    assert status == 1
    data = json.loads(out)
    assert data["target"] == "make_unused()" and data["exit_status"] == 1
    (f,) = data["findings"]
    assert (f["severity"], f["code"], f["lesson"], f["error_class"]) == (
        "error", "unused-parameters", "01", "parameter registration")
    assert f["evidence"][0] == "no gradient on any rank: spare.bias, spare.weight"


@pytest.mark.parametrize("target, expr, message", [
    ("{models}:Missing", "torch.randn(8, 16)", "has no 'Missing'; it defines: TenLayers, Unused, NoParams"),
    ("{models}.nope:TenLayers", "torch.randn(8, 16)", "no such file: "),
    ("{models}", "torch.randn(8, 16)", "give the module as path/to/file.py:Name"),
    ("{models}:broken_factory", "torch.randn(8, 16)",
     "building broken_factory() raised RuntimeError: CUDA is not available here"),
    ("{models}:TenLayers", "torch.randn(8, 16)",
     "the input does not fit TenLayers: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x16 and 64x64)"),
    ("{models}:NoParams", "torch.randn(8, 16)", "NoParams has no parameter that requires a gradient"),
    ("{models}:TenLayers", "torch.randn(8,", "--input 'torch.randn(8,' raised SyntaxError"),
])
def test_bad_input_exits_2_with_a_clear_message(models, capsys, target, expr, message):
    status, out, err = doctor_cli(capsys, target.format(models=models), "--input", expr)
    assert status == 2 and out == ""
    assert err.startswith("ddp-lab doctor: ") and message in err


def test_shape_error_shows_where_in_the_users_code(models, capsys):
    _, _, err = doctor_cli(capsys, f"{models}:TenLayers", "--input", "torch.randn(8, 16)")
    assert 'File "models.py", line 12, in forward' in err and "x = torch.relu(layer(x))" in err


def test_installed_command_on_a_ten_layer_module(models):
    exe = Path(sys.executable).with_name("ddp-lab")
    if not exe.exists():
        pytest.skip("the ddp-lab command is not installed in this environment")
    start = time.time()
    proc = subprocess.run([str(exe), "doctor", f"{models}:TenLayers", "--input", "torch.randn(32, 64)"],
                          capture_output=True, text=True, timeout=120)
    seconds = time.time() - start
    assert proc.returncode == 0, proc.stderr
    assert "no findings" in proc.stdout
    assert seconds < 60, f"ddp-lab doctor took {seconds:.1f} s (a fresh process: imports, fork server)"
