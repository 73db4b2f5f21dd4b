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


def test_the_pages_load_nothing_from_the_network_and_titles_are_plain(site):
    for path in [site / "index.html", *(site / f"{nb.stem}.html" for nb in NOTEBOOKS)]:
        page = path.read_text()
        assert not re.findall(r'<script[^>]*\bsrc="(?:https?:)?//', page), path.name  # no CDN script
        assert not re.findall(r'<link[^>]*\bhref="(?:https?:)?//', page), path.name
        assert '<link rel="icon" href="data:,">' in page, path.name  # no favicon.ico request
        title = re.search(r"<title>(.*?)</title>", page).group(1)
        assert "`" not in title and "<" not in title, (path.name, title)
        assert "Noto Sans CJK SC" in page, path.name  # the quotations' font stack


@pytest.fixture
def served(site):
    """The site on a local HTTP server, as a static host serves it (favicon requests included)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_every_page_works_offline_without_a_console_error(served, browser):
    """Only the local server answers (any other host is cut off, as in a room without a network);
    no page may log a console error, fail a request or get a 4xx/5xx (a missing favicon.ico)."""
    context = browser.new_context()
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(served)
                  else route.abort("internetdisconnected"))
    page = context.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status}: {r.url}"))
    for name in ["index.html", *(f"{nb.stem}.html" for nb in NOTEBOOKS)]:
        page.goto(f"{served}/{name}", wait_until="load")
        page.wait_for_timeout(200)  # a favicon request follows the load
        assert problems == [], (name, problems)
    context.close()


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
