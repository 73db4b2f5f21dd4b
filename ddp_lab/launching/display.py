"""How results look in a notebook: a compact per-rank table for a RunResult (and the HTML table
helpers the doctor's report uses too), and what the stop button leaves in a cell."""
from __future__ import annotations

import html

from .sanitize import sanitize

_COLOURS = {"ok": "#27ae60", "error": "#c0392b", "timeout": "#d68910", "crashed": "#7d3c98"}


HEADLINE_WIDTH = 120  # characters of "what happened" shown; the whole line is its tooltip
_NOWRAP = "white-space:nowrap"
_WHAT = "min-width:16em;max-width:48em;overflow-wrap:anywhere"


def cell(content: str, style: str, quote: str = '"') -> str:
    """`<td>` with its own style (JupyterLab's CSS right-aligns table cells); `content` is HTML."""
    return f"<td style={quote}{style}{quote}>{content}</td>"


def table(headers, rows, *, header_style: str = "text-align:left", style: str = "",
          quote: str = '"') -> str:
    """An HTML table: one header row of `headers` (HTML), then `rows` (each a `<tr>...</tr>`).
    `quote` quotes the attributes (the doctor's report has always used ', and its committed
    outputs compare byte for byte)."""
    head = "".join(f"<th style={quote}{header_style}{quote}>{h}</th>" for h in headers)
    attrs = f" style={quote}{style}{quote}" if style else ""
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _cell(text: str, style: str = "") -> str:
    return cell(html.escape(text), f"text-align:left;{style}")


def _what_cell(what: str, mark: str) -> str:
    """A long PyTorch message cut with "…" (its whole text in the tooltip and the traceback
    fold), so the other columns keep their width."""
    if len(what) <= HEADLINE_WIDTH:
        return _cell(what + mark, _WHAT)
    cut = what[:HEADLINE_WIDTH - 1]
    if cut.rfind(" ") > HEADLINE_WIDTH - 30:  # at a word boundary when one is near
        cut = cut[:cut.rfind(" ")]
    cut = cut.rstrip() + "…"
    return (f'<td style="text-align:left;{_WHAT}" title="{html.escape(what)}">'
            f"{html.escape(cut + mark)}</td>")


def _details(summary: str, body: str) -> str:
    if not body.strip():
        return ""
    return (f'<details><summary style="{_NOWRAP}">{html.escape(summary)}</summary>'
            f'<pre style="max-height:20em;overflow:auto">{html.escape(sanitize(body))}</pre></details>')


def _without(stderr: str, traceback: str) -> str:
    """A rank's stderr less the traceback it printed, which the traceback fold shows already."""
    return stderr.replace(traceback, "") if traceback.strip() else stderr


def run_result_html(result) -> str:
    """The HTML table of a `RunResult` (results.py calls this; display never imports results)."""
    rows = []
    for r in result.ranks:
        colour = _COLOURS.get(r.status, "black")
        what, mark = result.what_happened(r)
        mark = f" ← {mark}" if mark else ""
        folds = "".join([
            _details("traceback", r.error.traceback if r.error else ""),
            _details("stack when stopped", r.stack_summary() if r.stack else ""),
            _details("native stack (py-spy)", r.native_stack),
            _details("stdout", r.stdout),
            _details("stderr", _without(r.stderr, r.error.traceback if r.error else "")),
        ])
        rows.append(
            "<tr>" + _cell(f"rank {r.rank}", _NOWRAP)
            + _cell(r.status, f"color:{colour};font-weight:bold;{_NOWRAP}")
            + _what_cell(what, mark)
            + _cell(f"{r.seconds:.2f} s", _NOWRAP)
            + cell(folds, "text-align:left;min-width:8em") + "</tr>"
        )
    title = html.escape(f"{result.label + ': ' if result.label else ''}{result.status}, "
                        f"world_size={result.world_size}, backend={result.backend}")
    colour = _COLOURS.get(result.status, "black")
    divergence = result.divergence() if result.status == "timeout" else ""
    if divergence:
        from .divergence import table as recorded

        rows.append(f'<tr><td colspan="5" style="text-align:left">{html.escape(divergence)}'
                    f'{_details("flight recorder", recorded(result.ranks))}</td></tr>')
    columns = ("rank", "status", "what happened", "time", "details")
    return f'<div><b style="color:{colour}">RunResult</b> {title}{table(columns, rows)}</div>'


INTERRUPTED_LINE = "interrupted: the launch was stopped and every rank with it (their stacks are above)"


def show_interrupted(result, note: str) -> None:
    """What a notebook shows when the stop button lands during a launch: what the ranks printed
    so far, where each stopped rank was, and the per-rank table (its folds hold the stacks)."""
    result.print_output()
    for r in result.ranks:
        if r.note == note and r.stack_text():
            print(f"rank {r.rank} was stopped in:\n{r.stack_text(6)}")
    try:
        from IPython.display import display
    except ImportError:
        print(repr(result))
    else:
        display(result)

