"""`ddp-lab site build OUT`: an index, one page per lesson, the README and docs/ pages, checked as
files and then as Chromium renders them at 1280 and 420 px (tests/chromium.py; skipped, with the
reason, where there is none)."""
import posixpath
import re
from pathlib import Path

import nbformat
import pytest

from conftest import REPO as ROOT
from ddp_lab.cli import main

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DOC_PAGES = ["readme.html", *(f"docs/{p.stem}.html" for p in sorted((ROOT / "docs").glob("*.md")))]
PAGES = ["index.html", *(f"{nb.stem}.html" for nb in NOTEBOOKS), *DOC_PAGES]


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


def test_the_index_says_what_each_lesson_lets_you_try_and_how_to_run_it(site):
    """A panel only where the notebook has a widget (none in 11-18), exercises as tagged; the
    commands to run the notebooks; every docs page listed."""
    index = (site / "index.html").read_text()
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        row = re.search(rf'<td><a href="{path.stem}.html">.*?</tr>', index, re.S).group(0)
        assert ("a panel" in row) == (_count(path, "application/vnd.jupyter.widget-view+json") > 0), path.stem
        exercises = sum("exercise" in c.metadata.get("tags", []) and c.cell_type == "code" for c in nb.cells)
        assert (f"{exercises} exercise" in row) == (exercises > 0), (path.stem, row)
    assert "a panel" not in re.search(r'href="15_compile.html">.*?</tr>', index, re.S).group(0)
    assert ".venv/bin/jupyter lab notebooks/" in index and 'href="readme.html#quickstart"' in index
    assert all(f'href="{page}"' in index for page in DOC_PAGES[1:])


def test_the_repository_is_linked_from_every_page_when_known(tmp_path):
    """`--repository URL`: for a checkout whose git `origin` is unknown or not a web address."""
    assert main(["site", "build", str(tmp_path / "s"), "--notebooks", str(ROOT / "notebooks"),
                 "--repository", "https://example.org/ddp-lab"]) == 0
    for name in ["index.html", f"{NOTEBOOKS[0].stem}.html", "docs/glossary.html"]:
        assert '<a href="https://example.org/ddp-lab">repository</a>' in (tmp_path / "s" / name).read_text(), name


def _ids(page: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page))


def test_every_link_between_pages_resolves_anchors_included(site):
    """Each local href of each page names a page of the site, and its #anchor an id there; lesson
    pages and docs pages with two sections or more have a table of contents."""
    checked = 0
    for name in PAGES:
        page = (site / name).read_text()
        for href in re.findall(r'<a [^>]*href="([^"]+)"', page):
            if re.match(r"[a-z]+:", href):
                continue
            target, _, anchor = href.partition("#")
            path = posixpath.normpath(posixpath.join(posixpath.dirname(name), target)) if target else name
            assert (site / path).is_file(), (name, href)
            if anchor:
                assert anchor in _ids((site / path).read_text()), (name, href)
            checked += 1
        if name != "index.html" and (name[0].isdigit() or page.count("<h2") >= 2):
            assert 'class="ddp-toc"' in page, name
    assert checked > 500, checked


def test_the_pages_load_nothing_from_the_network_and_titles_are_plain(site):
    for path in [site / name for name in PAGES]:
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
    for name in PAGES:
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


WIDER = """() => { const w = document.documentElement.clientWidth;
  const wide = [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w + 1)
    .filter(e => !e.parentElement.closest('.ddp-scroll, .jp-RenderedImage, pre, .ddp-nav, .jp-OutputArea-output'));
  return [document.documentElement.scrollWidth - w, wide.slice(0, 3).map(e => e.tagName + ' ' + e.textContent.slice(0, 40))]; }"""
CUT = """() => [...document.querySelectorAll('.jp-RenderedMarkdown p, .jp-RenderedMarkdown li')]
  .filter(e => e.getBoundingClientRect().right > e.closest('.jp-Cell').getBoundingClientRect().right + 1)
  .map(e => e.textContent.slice(0, 40))"""


# Each code cell's code: [whether it is wider than its box, whether it is cut off there (a box
# that clips it, nbconvert's .jp-InputArea-editor{overflow:hidden}, before any box that scrolls)].
CODE = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-editor')].map(cell => {
  const pre = cell.querySelector('pre');
  for (let x = pre; x && x !== cell.parentElement; x = x.parentElement) {
    const s = getComputedStyle(x), wider = x.scrollWidth > x.clientWidth + 1;
    if (wider && ['auto', 'scroll'].includes(s.overflowX)) return [true, false];
    if (wider && ['hidden', 'clip'].includes(s.overflowX)) return [true, true];
  }
  return [pre.getBoundingClientRect().right > document.documentElement.clientWidth + 1, false]; })"""


def _code_cells(path: Path) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)


@pytest.mark.parametrize("width", [1280, 420])
def test_no_page_is_wider_than_the_window(site, browser, width):
    """At a laptop's and a phone's width: the page never scrolls sideways (wide tables, code and
    figures scroll inside their own box), no paragraph runs past its cell (long inline code),
    and no code cell is cut off: a line longer than the cell scrolls inside it (issue 47: at
    420 px 21 of lesson 19's 24 code cells were clipped, with no scrollbar)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    wider = 0
    for name in PAGES:
        page.goto((site / name).as_uri())
        overflow, wide = page.evaluate(WIDER)
        assert overflow <= 0 and wide == [], (width, name, overflow, wide)
        assert page.evaluate(CUT) == [], (width, name)
        if name[0].isdigit():
            cells = page.evaluate(CODE)
            assert len(cells) == _code_cells(ROOT / "notebooks" / name.replace(".html", ".ipynb")), name
            cut = [i for i, (_, clipped) in enumerate(cells) if clipped]
            assert cut == [], (width, name, f"{len(cut)} of {len(cells)} code cells cut off", cut[:5])
            wider += sum(w for w, _ in cells)
    if width == 420:  # the check measured something: at a phone's width many cells scroll
        assert wider > 100, wider
    page.goto((site / f"{NOTEBOOKS[-1].stem}.html").as_uri())
    sizes = page.eval_on_selector_all("img", "els => els.map(e => [e.naturalWidth, e.getBoundingClientRect().width])")
    if width == 420:  # a figure keeps its own size and scrolls, never shrunk to a stamp
        assert all(shown >= natural - 1 for natural, shown in sizes), sizes
    page.close()


@pytest.mark.parametrize("width", [1280, 420])
def test_a_section_link_puts_its_heading_below_the_top_bar(site, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 700})
    for name in [f"{NOTEBOOKS[-1].stem}.html", "readme.html", "docs/glossary.html"]:
        page.goto((site / name).as_uri())
        links = page.locator(".ddp-toc a")
        assert links.count() >= 2, name
        for k in (1, links.count() - 1):
            anchor = links.nth(k).get_attribute("href")[1:]
            links.nth(k).click()
            page.wait_for_timeout(100)
            bar = page.eval_on_selector(".ddp-nav", "e => e.getBoundingClientRect().bottom")
            top = page.evaluate("a => document.getElementById(a).getBoundingClientRect().top", anchor)
            assert top >= bar, (width, name, anchor, top, bar)
            page.goto((site / name).as_uri())
    page.close()


def test_the_docs_pages_are_reached_from_the_index(site, browser):
    page = browser.new_page()
    page.goto((site / "index.html").as_uri())
    page.click(".ddp-nav >> text=glossary")
    assert page.url.endswith("docs/glossary.html") and page.locator("h1").inner_text() == "Glossary"
    page.click(".ddp-nav >> text=README")
    assert page.url.endswith("readme.html")
    page.click('a[href="docs/watch.html"] >> nth=0')
    assert "examples/watch_train.py:train_step" in page.content()
    page.click(".ddp-nav >> text=ddp-lab")
    assert page.url.endswith("index.html")
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
