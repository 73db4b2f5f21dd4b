"""The README and `docs/*.md` as pages of the site, beside the lessons.

    README.md         -> readme.html
    docs/NAME.md      -> docs/NAME.html
    notebooks/NN_x.ipynb (a link to it) -> NN_x.html, the lesson's page

Markdown is rendered by mistune, the renderer nbconvert itself uses (so nothing new to install).
Headings get GitHub's anchors (`## Test suite` -> `#test-suite`), so a link such as
`docs/measured.md#test-suite` works alike on GitHub and on the site. A relative link to another
file of the repository points into the repository when its address is known, and is shown as
plain text otherwise: the site never links to a page it does not have.
"""
from __future__ import annotations

import html
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

_LESSON = re.compile(r"^notebooks/(\d\d_\w+)\.ipynb$")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def slug(text: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"<[^>]+>", "", html.unescape(text)).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text))


def site_path(repo_path: str) -> str | None:
    """Where a file of the repository is on the site, or None when the site has no page for it."""
    if repo_path == "README.md":
        return "readme.html"
    if repo_path.startswith("docs/") and repo_path.endswith(".md") and repo_path.count("/") == 1:
        return repo_path[:-3] + ".html"
    lesson = _LESSON.match(repo_path)
    return f"{lesson.group(1)}.html" if lesson else None


@dataclass
class Doc:
    repo_path: str  # README.md, docs/watch.md
    text: str

    @property
    def page(self) -> str:
        return site_path(self.repo_path)

    @property
    def title(self) -> str:
        first = re.search(r"^# (.+)$", self.text, re.M)
        return first.group(1).strip() if first else self.repo_path


def docs_of(root: Path) -> list[Doc]:
    """The README, then every docs/*.md in name order (those that exist)."""
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [Doc(p.relative_to(root).as_posix(), p.read_text(encoding="utf-8")) for p in paths if p.is_file()]


def resolve(doc_path: str, href: str) -> tuple[str, str]:
    """A relative link of a markdown file as (repository path, '#anchor' or '')."""
    target, _, anchor = href.partition("#")
    path = posixpath.normpath(posixpath.join(posixpath.dirname(doc_path), target)) if target else doc_path
    return path, f"#{anchor}" if anchor else ""


def site_href(doc_path: str, href: str, repository: str | None) -> str | None:
    """The href a link of `doc_path` gets on the site (None: show its text unlinked)."""
    if _SCHEME.match(href) or href.startswith("#"):
        return href
    path, anchor = resolve(doc_path, href)
    page = site_path(path)
    if page is not None:
        return posixpath.relpath(page, posixpath.dirname(site_path(doc_path))) + anchor
    if repository:
        return f"{repository}/blob/HEAD/{path}{anchor}"
    return None


def render(doc: Doc, repository: str | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The document's HTML body and its table of contents: (anchor, heading HTML) of each `##`."""
    import mistune

    toc: list[tuple[str, str]] = []

    class Renderer(mistune.HTMLRenderer):
        def heading(self, text, level, **attrs):
            anchor = slug(text)
            if level == 2:
                toc.append((anchor, text))
            return f'<h{level} id="{anchor}">{text}</h{level}>\n'

        def link(self, text, url, title=None):
            href = site_href(doc.repo_path, url, repository)
            if href is None:
                return f'<span class="ddp-nolink">{text}</span>'
            return super().link(text, href, title)

    md = mistune.create_markdown(renderer=Renderer(escape=False), plugins=["table", "strikethrough"])
    body = re.sub(r"<table>.*?</table>", lambda m: f'<div class="ddp-scroll">{m.group(0)}</div>', md(doc.text), flags=re.S)
    return body, toc


def toc_html(toc: list[tuple[str, str]]) -> str:
    """A page's table of contents (empty when it has fewer than two sections)."""
    if len(toc) < 2:
        return ""
    items = "".join(f'<li><a href="#{anchor}">{text}</a></li>' for anchor, text in toc)
    return f'<nav class="ddp-toc" aria-label="contents"><b>On this page</b><ol>{items}</ol></nav>'
