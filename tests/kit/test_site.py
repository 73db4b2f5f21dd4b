"""`ddp-lab site build OUT`: an index and one page per lesson, checked as files and then as
Chromium renders them (tests/chromium.py; skipped, with the reason, where there is none)."""
import re
from pathlib import Path

import nbformat
import pytest

from conftest import REPO as ROOT
from ddp_lab.cli import main

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _count(path: Path, mime: str) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum(mime in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def _in_html(path: Path, fragment: str) -> int:
    """How often `fragment` occurs in the notebook's HTML outputs."""
    nb = nbformat.read(path, as_version=4)
    return sum("".join(o["data"]["text/html"]).count(fragment) for c in nb.cells
               for o in c.get("outputs", []) if "text/html" in o.get("data", {}))


def _folds(path: Path) -> int:
    """<details> folds in the notebook's HTML outputs (the per-rank tables' traceback, stdout...)."""
    return _in_html(path, "<details")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    assert main(["site", "build", str(out)]) == 0
    return out


def test_the_index_links_every_lesson_page(site):
    index = (site / "index.html").read_text()
    links = re.findall(r'href="(\d\d_\w+\.html)"', index)
    assert links == [f"{p.stem}.html" for p in NOTEBOOKS]
    assert all((site / link).is_file() for link in links)
    assert "<code>no_sync</code>" in index  # the README's "what goes wrong" column


def test_each_page_has_its_figures_tables_and_navigation(site):
    for i, path in enumerate(NOTEBOOKS):
        page = (site / f"{path.stem}.html").read_text()
        assert page.count('src="data:image/png;base64,') == _count(path, "image/png"), path.stem
        assert page.count('<b style="color') >= _in_html(path, '<b style="color'), path.stem  # per-rank tables
        assert 'href="index.html"' in page
        if i + 1 < len(NOTEBOOKS):
            assert f'rel="next" href="{NOTEBOOKS[i + 1].stem}.html"' in page
        assert "VBox(children" not in page and "widget-view+json" not in page


def test_chromium_renders_every_page_with_its_figures(site, browser):
    page = browser.new_page()
    page.goto((site / "index.html").as_uri())
    page.click(f'text={nbformat.read(NOTEBOOKS[0], as_version=4).cells[0].source.splitlines()[0][2:].split("· ", 1)[1]}')
    assert page.url.endswith(f"{NOTEBOOKS[0].stem}.html")
    for path in NOTEBOOKS:
        page.goto((site / f"{path.stem}.html").as_uri())
        sizes = page.eval_on_selector_all("img", "els => els.map(e => [e.naturalWidth, e.naturalHeight])")
        assert len(sizes) == _count(path, "image/png"), path.stem
        assert all(w > 100 and h > 100 for w, h in sizes), (path.stem, sizes)  # decoded, drawn
        assert page.locator("details").count() == _folds(path), path.stem
    page.click('a[rel="prev"] >> nth=0')
    assert page.url.endswith(f"{NOTEBOOKS[-2].stem}.html")
    page.close()


def test_without_chromium_the_browser_tests_skip_and_say_why(monkeypatch):
    import chromium

    monkeypatch.setattr(chromium, "find_chromium", lambda: None)
    monkeypatch.delenv("DDP_LAB_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium found"):
        with chromium.chromium_browser():
            pass
    monkeypatch.setenv("DDP_LAB_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="DDP_LAB_REQUIRE_BROWSER=1"):
        with chromium.chromium_browser():
            pass
