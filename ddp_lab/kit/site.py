"""`ddp-lab site build OUT`: a static site of the course from the committed, executed notebooks.

    OUT/index.html           the lesson table, linking every page
    OUT/NN_name.html         one page per lesson: its prose, code, figures, per-rank tables and
                             folds, with links to the previous lesson, the index and the next

Pages are rendered by nbconvert's HTML exporter (JupyterLab's own template), the tool Jupyter
itself uses to export notebooks: the pages look like the notebooks in JupyterLab, figures are
embedded as data, and the rich outputs (the per-rank tables and their <details> folds) stay
exactly the HTML the package produced. It needs no build step other than Python and is already
a dependency of nbval/JupyterLab; MyST / Jupyter Book would add a second toolchain for a site
that is only a table and twelve pages. Widget panels need a kernel, so pages show their text form.
The output can be served from any static host.
"""
from __future__ import annotations

import copy
import html
import re
from pathlib import Path

from .coursebook import LessonNotebook, lesson_notebooks
from .staging import staged

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# The lessons quote Chinese (00, 04, 05): name CJK fonts after the Latin ones, so a machine with
# any of them shows the characters, not empty boxes (binder/apt.txt installs fonts-noto-cjk).
CJK = "'Noto Sans CJK SC','Noto Sans SC','Source Han Sans SC','PingFang SC','Microsoft YaHei','WenQuanYi Micro Hei'"
FONTS = f"system-ui,-apple-system,'Segoe UI',helvetica,arial,{CJK},sans-serif"
MONO = f"menlo,consolas,'DejaVu Sans Mono',{CJK.replace('Sans', 'Sans Mono', 1)},{CJK},monospace"
# No favicon.ico request (a 404 on every static host without one): an empty icon, inline.
_ICON = '<link rel="icon" href="data:,">'
_STYLE = _ICON + f"""<style>
:root{{--jp-content-font-family:{FONTS};--jp-ui-font-family:{FONTS};--jp-code-font-family:{MONO}}}
.ddp-nav{{display:flex;gap:1.5em;padding:.6em 1em;border-bottom:1px solid #ccc;font-size:15px;
  font-family:{FONTS};position:sticky;top:0;background:#fff;z-index:10}}
.ddp-nav a{{text-decoration:none}}
.ddp-index{{font-size:16px;font-family:{FONTS};max-width:60em;margin:2em auto;padding:0 1em}}
.ddp-index table{{border-collapse:collapse}}.ddp-index td,.ddp-index th{{padding:.3em .8em;
  border-bottom:1px solid #ddd;text-align:left;vertical-align:top}}
</style>"""
# nbconvert's lab template loads require.js and MathJax from a CDN; no page has maths and the
# widgets are gone (_static), so both go: the site works offline (a workshop room's network).
_REMOTE_SCRIPT = re.compile(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>\s*')
_MATHJAX_CONFIG = re.compile(r'<script type="text/x-mathjax-config">.*?</script>', re.S)


def _static(nb):
    """The notebook without live widgets: each widget output keeps only its text form."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            out.get("data", {}).pop(WIDGET_VIEW, None)
    return nb


def _nav(lessons: list[LessonNotebook], i: int) -> str:
    links = []
    if i > 0:
        links.append(f'<a rel="prev" href="{lessons[i - 1].stem}.html">← {lessons[i - 1].id}</a>')
    links.append('<a href="index.html">all lessons</a>')
    if i + 1 < len(lessons):
        links.append(f'<a rel="next" href="{lessons[i + 1].stem}.html">{lessons[i + 1].id} →</a>')
    return f'<nav class="ddp-nav">{"".join(links)}</nav>'


def lesson_page(lessons: list[LessonNotebook], i: int) -> str:
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(_static(lessons[i].nb))
    title = html.escape(f"{lessons[i].id} · {_plain(lessons[i].title)}")
    body = body.replace("<title>Notebook</title>", f"<title>{title}</title>", 1)
    body = _MATHJAX_CONFIG.sub("", _REMOTE_SCRIPT.sub("", body))
    body = body.replace("</head>", _STYLE + "</head>", 1)
    start = body.index(">", body.index("<body")) + 1
    nav = _nav(lessons, i)
    end = body.rindex("</body>")
    return body[:start] + nav + body[start:end] + nav + body[end:]


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


def index_page(lessons: list[LessonNotebook], words: dict[str, str]) -> str:
    rows = "".join(
        f'<tr><td>{l.id}</td><td><a href="{l.stem}.html">{_inline(l.title)}</a></td>'
        f"<td>{_inline(words.get(l.id, ''))}</td></tr>" for l in lessons)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ddp-lab: the course</title>"
            f"{_STYLE}</head><body><div class='ddp-index'><h1>ddp-lab</h1>"
            "<p>An executable course on the errors people hit when they put their own "
            "<code>nn.Module</code> into PyTorch distributed training. Every page is a notebook as "
            "it ran: real ranks, PyTorch's own errors, the figures. Run them yourself in "
            "JupyterLab to use the panels.</p>"
            "<table><thead><tr><th>id</th><th>lesson</th><th>what goes wrong</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div></body></html>")


def build_site(out, notebooks="notebooks") -> Path:
    """Write the site into `out` (its earlier pages replaced); built in a temporary folder and
    moved into place at the end, so a failure leaves no half-built site."""
    out = Path(out)
    lessons = lesson_notebooks(notebooks)
    with staged(out, ".site-") as tmp:
        words = what_goes_wrong(Path(notebooks).resolve().parent / "README.md")
        pages = {"index.html": index_page(lessons, words)}
        for i, lesson in enumerate(lessons):
            pages[f"{lesson.stem}.html"] = lesson_page(lessons, i)
        for name, text in pages.items():
            (tmp / name).write_text(text, encoding="utf-8")
    print(f"site of {len(lessons)} lessons in {out}/ (open {out}/index.html)")
    return out
