"""requirements.txt, binder/requirements.txt and environment.yml describe the same environment."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _names(lines):
    names = set()
    for line in lines:
        line = line.strip()
        if line.startswith("- "):  # a YAML list item
            line = line[2:].strip()
        if not line or line.startswith(("#", "-", "./")):  # comments, pip options, the course's own folders
            continue
        names.add(re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def _pip_section_of_environment_yml():
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- pip:")
    return [l for l in lines[start + 1:] if l.startswith("      - ")]


def test_the_three_environment_files_name_the_same_packages():
    pip = _names((ROOT / "requirements.txt").read_text().splitlines())
    binder = _names((ROOT / "binder/requirements.txt").read_text().splitlines())
    conda = _names(_pip_section_of_environment_yml())
    assert pip == binder == conda
    assert {"torch", "cloudpickle", "nbval", "ipywidgets"} <= pip


def test_torch_is_pinned_to_one_release_everywhere():
    for path in ("requirements.txt", "binder/requirements.txt", "environment.yml"):
        assert re.search(r"^\s*(- )?torch==\d+\.\d+\.\d+\s*$", (ROOT / path).read_text(), re.M), path


def test_deepspeed_is_pinned_to_the_tested_release_everywhere():
    for path in ("requirements.txt", "binder/requirements.txt", "environment.yml"):
        assert re.search(r"^\s*(- )?deepspeed==0\.19\.8\s*$", (ROOT / path).read_text(), re.M), path


def test_package_dependencies_are_in_the_environment():
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pip = _names((ROOT / "requirements.txt").read_text().splitlines())
    assert _names(deps) <= pip


def test_ci_runs_the_readme_commands_and_strict_nbval():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    commands = re.findall(r"```bash\n(.+?)\n```", readme.split("## Quickstart", 1)[1], re.S)[0].splitlines()
    commands = [c for c in commands if c and not c.startswith("#")]
    assert len(commands) == 2
    assert commands[0].split(" --quiet")[0] in ci.replace(" --quiet", "") and commands[1] in ci
    assert "--nbval-lax" not in ci + (ROOT / "pyproject.toml").read_text()


CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def test_the_three_files_take_torch_from_the_cpu_index():
    # torch==2.13.0 from PyPI alone is the CUDA build on Linux (issue 16, point 10)
    for path in ("requirements.txt", "binder/requirements.txt", "environment.yml"):
        lines = [l.strip().removeprefix("- ") for l in (ROOT / path).read_text().splitlines()]
        assert CPU_INDEX in lines, path


def test_ci_installs_chromium_and_requires_the_browser_tests():
    ci = (ROOT / ".ci/run").read_text()
    assert "apt-get install -y -qq chromium" in ci and "DDP_LAB_REQUIRE_BROWSER=1" in ci
    assert "playwright" in _names((ROOT / "requirements.txt").read_text().splitlines())


def test_binder_installs_a_cjk_font_and_the_site_names_one():
    """The quotations of lessons 00, 04 and 05 are Chinese: Binder's image gets a CJK font and
    the site's font stack names it (tests/kit/test_site.py checks the built pages)."""
    apt = [l.strip() for l in (ROOT / "binder/apt.txt").read_text().splitlines() if not l.startswith("#")]
    assert "fonts-noto-cjk" in apt
    from ddp_lab.kit.site import FONTS
    assert "Noto Sans CJK SC" in FONTS
    assert any("\u4e00" <= ch <= "\u9fff" for nb in ("00", "04", "05")
               for path in (ROOT / "notebooks").glob(f"{nb}_*.ipynb") for ch in path.read_text())


def test_binder_turns_jupyterlab_s_news_pop_up_off_where_jupyterlab_reads_it(tmp_path):
    """binder/postBuild copies jupyter/ddp-lab-overrides.json into the environment's
    share/jupyter/lab/settings/overrides.d/; JupyterLab's own reader then turns news off."""
    import json
    import subprocess
    import sys

    from jupyterlab.commands import get_app_dir
    from jupyterlab_server.settings_utils import _get_overrides

    settings = json.loads((ROOT / "jupyter/ddp-lab-overrides.json").read_text())
    schema = json.loads((Path(get_app_dir()) / "schemas/@jupyterlab/apputils-extension/notification.json").read_text())
    assert set(settings["@jupyterlab/apputils-extension:notification"]) <= set(schema["properties"])
    # run postBuild's own lines (not its pip install) with a python whose prefix is tmp_path
    post = (ROOT / "binder/postBuild").read_text()
    assert "share/jupyter/lab/settings/overrides.d" in post
    lines = post[post.index("settings="):]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f"#!/bin/sh\necho {tmp_path}\n")
    (fake / "python").chmod(0o755)
    subprocess.run(["bash", "-euo", "pipefail", "-c", lines], cwd=ROOT, check=True,
                   env={"PATH": f"{fake}:/usr/bin:/bin"})
    # where JupyterLab looks: {sys.prefix}/share/jupyter/lab/settings (its app settings dir)
    assert Path(get_app_dir()) == Path(sys.prefix) / "share/jupyter/lab"
    overrides, error = _get_overrides(str(tmp_path / "share/jupyter/lab/settings"))
    assert error == "" and overrides["@jupyterlab/apputils-extension:notification"] == {
        "fetchNews": "false", "checkForUpdates": False}


def test_the_readme_environment_turns_jupyterlab_s_news_pop_up_off_too():
    """requirements.txt (the README's first command) installs jupyter/ as a package whose data
    file lands in {sys.prefix}/share/jupyter/lab/settings/overrides.d/, where binder/postBuild
    copies the same file (an editable install of ddp_lab cannot carry data files)."""
    import tomllib

    assert "./jupyter" in (ROOT / "requirements.txt").read_text().splitlines()
    assert "      - ./jupyter" in (ROOT / "environment.yml").read_text().splitlines()
    project = tomllib.loads((ROOT / "jupyter/pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["data-files"] == {
        "share/jupyter/lab/settings/overrides.d": ["ddp-lab-overrides.json"]}
