"""`ddp-lab site build OUT`: a static site of the course from the committed, executed notebooks,
with the README and the docs/ pages beside them.

    OUT/index.html           the lessons' table (what each lets you try), how to run them, the docs
    OUT/NN_name.html         one page per lesson: its prose, code, figures, per-rank tables and
                             folds, a table of contents, links to the previous and next lesson
    OUT/readme.html          the README; OUT/docs/NAME.html: docs/NAME.md (docpages.py)

Lesson pages are rendered by nbconvert's HTML exporter (JupyterLab's own template), the tool
Jupyter itself uses to export notebooks: the pages look like the notebooks in JupyterLab, figures
are embedded as data, and the rich outputs (the per-rank tables and their <details> folds) stay
exactly the HTML the package produced. It needs no build step other than Python and is already
a dependency of nbval/JupyterLab; MyST / Jupyter Book would add a second toolchain for a site
of a table, the lessons and a dozen pages. Widget panels need a kernel, so pages show their text
form. Every page works offline, and the output can be served from any static host.
"""
from __future__ import annotations

import copy
import html
import re
import subprocess
from pathlib import Path

from .coursebook import LessonNotebook, lesson_notebooks, tags
from .docpages import Doc, docs_of, render, toc_html
from .site_style import CJK, FONTS, MONO, STYLE, VIEWPORT  # noqa: F401 (FONTS: the environment test)
from .staging import staged

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# nbconvert's lab template loads require.js and MathJax from a CDN; no page has maths and the
# widgets are gone (_static), so both go: the site works offline (a workshop room's network).
_REMOTE_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>\s*')
_MATHJAX_CONFIG = re.compile(r'<script type="text/x-mathjax-config">.*?</script>', re.S)
_H2 = re.compile(r'<h2 id="([^"]+)">(.*?)<a class="anchor-link"', re.S)
RUN_IT = ("python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && "
          ".venv/bin/ddp-lab build-ops && .venv/bin/ddp-lab tour\n.venv/bin/jupyter lab notebooks/")


def _static(nb):
    """The notebook without live widgets: each widget output keeps only its text form."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            out.get("data", {}).pop(WIDGET_VIEW, None)
    return nb


def try_it(lesson: LessonNotebook) -> str:
    """What a lesson lets the learner try, read from the notebook: a widget panel, exercises."""
    outputs = [o for c in lesson.nb.cells for o in c.get("outputs", [])]
    found = ["a panel"] if any(WIDGET_VIEW in o.get("data", {}) for o in outputs) else []
    exercises = sum("exercise" in tags(c) and c.cell_type == "code" for c in lesson.nb.cells)
    if exercises:
        found.append(f"{exercises} exercise{'s' * (exercises > 1)} with a checker")
    return ", ".join(found)


def top_bar(here: str, depth: int, docs: list[Doc], repository: str | None, lessons=None, i=None) -> str:
    """The sticky bar of every page: the course, the README, the glossary, the repository, and on
    a lesson page its neighbours. `depth` is how many folders below OUT the page is."""
    up = "../" * depth
    named = {"README.md": "README", "docs/glossary.md": "glossary"}  # those the folder has
    links = [("index.html", "ddp-lab"), *((d.page, named[d.repo_path]) for d in docs if d.repo_path in named)]
    items = [f'<a href="{up}{href}"{" class=ddp-here" if href == here else ""}>{text}</a>'
             for href, text in links]
    if lessons is not None:
        if i > 0:
            items.insert(0, f'<a rel="prev" href="{lessons[i - 1].stem}.html">← {lessons[i - 1].id}</a>')
        if i + 1 < len(lessons):
            items.append(f'<a rel="next" href="{lessons[i + 1].stem}.html">{lessons[i + 1].id} →</a>')
    if repository:
        items.append(f'<a href="{html.escape(repository)}">repository</a>')
    return f'<nav class="ddp-nav">{"".join(items)}</nav>'


def _foot(lessons: list[LessonNotebook], i: int) -> str:
    links = []
    if i > 0:
        links.append(f'<a href="{lessons[i - 1].stem}.html">← {lessons[i - 1].id} · {_inline(lessons[i - 1].title)}</a>')
    links.append('<a href="index.html">all lessons</a>')
    if i + 1 < len(lessons):
        links.append(f'<a href="{lessons[i + 1].stem}.html">{lessons[i + 1].id} · {_inline(lessons[i + 1].title)} →</a>')
    return f'<nav class="ddp-foot">{"".join(links)}</nav>'


def lesson_page(lessons: list[LessonNotebook], i: int, docs: list[Doc] = (), repository=None) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(_static(lessons[i].nb))
    title = html.escape(f"{lessons[i].id} · {_plain(lessons[i].title)}")
    body = body.replace("<title>Notebook</title>", f"<title>{title}</title>", 1)
    body = _MATHJAX_CONFIG.sub("", _REMOTE_SCRIPT.sub("", body))
    body = body.replace("</head>", STYLE + "</head>", 1)
    start = body.index(">", body.index("<body")) + 1
    toc = toc_html([(anchor, text) for anchor, text in _H2.findall(body)])
    nav = top_bar(f"{lessons[i].stem}.html", 0, list(docs), repository, lessons, i)
    end = body.rindex("</body>")
    return body[:start] + nav + toc + body[start:end] + _foot(lessons, i) + body[end:]


def what_goes_wrong(readme: Path) -> dict[str, str]:
    """Lesson id -> the README's "what goes wrong" column ({} when there is no README)."""
    if not readme.is_file():
        return {}
    rows = re.findall(r"^\| (\d\d) \| \[[^\]]+\]\([^)]+\) \| (.+?) \|\s*$", readme.read_text(), re.M)
    return dict(rows)


def _plain(text: str) -> str:
    """Markdown `code` as plain text (a <title> shows no markup)."""
    return re.sub(r"`([^`]+)`", r"\1", text)


def _inline(text: str) -> str:
    """Markdown `code` in a table cell, as HTML."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _page(title: str, nav: str, main: str, css_class: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{VIEWPORT}"
            f"<title>{html.escape(title)}</title>{STYLE}</head><body>{nav}"
            f"<main class='{css_class}'>{main}</main></body></html>")


def index_page(lessons: list[LessonNotebook], words: dict[str, str], docs: list[Doc] = (),
               repository: str | None = None) -> str:
    rows = "".join(
        f'<tr><td>{l.id}</td><td><a href="{l.stem}.html">{_inline(l.title)}</a></td>'
        f"<td>{_inline(words.get(l.id, ''))}</td><td>{try_it(l)}</td></tr>" for l in lessons)
    pages = "".join(f'<li><a href="{d.page}">{_inline(d.title)}</a></li>' for d in docs)
    where = (f'<a href="{html.escape(repository)}">its repository</a>' if repository
             else "its repository")
    more = ('More in the <a href="readme.html#quickstart">README\'s quickstart</a>.'
            if any(d.repo_path == "README.md" for d in docs) else "")
    main = ("<h1>ddp-lab</h1>"
            "<p>An executable course on the errors people hit when they put their own "
            "<code>nn.Module</code> into PyTorch distributed training. Every page is a notebook as "
            "it ran: real ranks, PyTorch's own errors, the figures.</p>"
            f"<h2 id='run-it-yourself'>Run it yourself</h2><p>Clone {where}, then, in its folder "
            "(Python 3.10+, Linux or macOS; the first command takes a few minutes):</p>"
            f"<pre><code>{html.escape(RUN_IT)}</code></pre><p>and open the lessons in order. "
            "The panels and exercises need a running notebook: here they show what they printed. "
            + more + "</p>"
            "<h2 id='lessons'>The lessons</h2><div class='ddp-scroll'><table class='ddp-lessons'><thead><tr><th>id</th>"
            "<th>lesson</th><th>what goes wrong</th><th>try it in the notebook</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
            + (f"<h2 id='docs'>Beside the lessons</h2><ul>{pages}</ul>" if pages else ""))
    return _page("ddp-lab: the course", top_bar("index.html", 0, list(docs), repository), main, "ddp-index")


def doc_page(doc: Doc, docs: list[Doc], repository: str | None = None) -> str:
    body, toc = render(doc, repository)
    depth = doc.page.count("/")
    nav = top_bar(doc.page, depth, docs, repository)
    body = body.replace("</h1>", "</h1>" + toc_html(toc), 1) if "</h1>" in body else toc_html(toc) + body
    return _page(f"ddp-lab: {_plain(doc.title)}", nav, body, "ddp-doc")


def repository_of(root: Path) -> str | None:
    """The repository's web address, from git's `origin` remote (None without one)."""
    try:
        url = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    url = re.sub(r"^git@([^:]+):", r"https://\1/", url)
    return url.removesuffix(".git") if url.startswith("https://") else None


def build_site(out, notebooks="notebooks", repository: str | None = None) -> Path:
    """Write the site into `out` (its earlier pages replaced); built in a temporary folder and
    moved into place at the end, so a failure leaves no half-built site. `repository`: the web
    address the pages link to (default: git's `origin`, when it is a web address)."""
    out = Path(out)
    lessons = lesson_notebooks(notebooks)
    root = Path(notebooks).resolve().parent
    repository = repository or repository_of(root)
    docs = docs_of(root)
    with staged(out, ".site-") as tmp:
        words = what_goes_wrong(root / "README.md")
        pages = {"index.html": index_page(lessons, words, docs, repository)}
        for i, lesson in enumerate(lessons):
            pages[f"{lesson.stem}.html"] = lesson_page(lessons, i, docs, repository)
        for doc in docs:
            pages[doc.page] = doc_page(doc, docs, repository)
        for name, text in pages.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_text(text, encoding="utf-8")
    print(f"site of {len(lessons)} lessons and {len(docs)} pages in {out}/ (open {out}/index.html)")
    return out
