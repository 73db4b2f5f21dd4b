"""A headless Chromium for the browser tests: Playwright (from PyPI) driving Debian's `chromium`
(apt). Playwright cannot download its own browsers here, so it is given the executable. When
either is missing the tests skip, saying which."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager

import pytest

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


def find_chromium() -> str | None:
    env = os.environ.get("DDP_LAB_CHROMIUM")
    for path in (env, *CANDIDATES, shutil.which("chromium"), shutil.which("chromium-browser")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _missing(reason: str):
    """Skip; but fail where CI asked for the browser (DDP_LAB_REQUIRE_BROWSER=1, set by .ci/run)."""
    if os.environ.get("DDP_LAB_REQUIRE_BROWSER") == "1":
        pytest.fail(reason + ", and DDP_LAB_REQUIRE_BROWSER=1 asks for the browser tests")
    pytest.skip(reason)


@contextmanager
def chromium_browser():
    """A launched Chromium (Playwright's Browser), or the test skips with the reason."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -r requirements.txt)")
    path = find_chromium()
    if path is None:
        _missing("no Chromium found (apt-get install chromium, or set DDP_LAB_CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()
