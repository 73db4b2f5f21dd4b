"""A `Report` as text for a terminal and as an HTML table for Jupyter."""
from __future__ import annotations

import html
import textwrap

from ..launching.display import cell, table
from .strategies import strategy_names

MARK = {"error": "ERROR", "warning": "WARN ", "info": "info "}
COLOUR = {"error": "#e74c3c", "warning": "#e67e22", "info": "#3498db"}  # legible on light and dark
TRACE_LINES = 12  # lines of a trace shown in text (the JSON has all of it)


def _wrap(text: str, first: str, rest: str, width: int = 100) -> list[str]:
    out = []
    for para in text.splitlines() or [""]:
        out += textwrap.wrap(para, width, initial_indent=first, subsequent_indent=rest,
                             break_on_hyphens=False, break_long_words=False) or [first]
        first = rest
    return out


def finding_text(f, traces: bool = False) -> list[str]:
    pad = " " * 8
    only = strategy_names(f.strategies)
    lines = [f"{MARK[f.severity]}  [{f.lesson} {f.error_class}] {f.code}: {f.title}"
             + (f" ({only})" if only else "")]
    if f.where:
        lines += _wrap("at " + f.where, pad, pad + "   ")
    for ev in f.evidence:
        lines += _wrap(ev, pad + "- ", pad + "  ")
    if f.fix:
        lines += _wrap("fix: " + f.fix, pad, pad + "     ")
    if f.trace:
        tr = f.trace.splitlines()
        if not traces and len(tr) > TRACE_LINES:
            tr = tr[:TRACE_LINES // 2] + [f"... ({len(tr) - TRACE_LINES} lines; --json or "
                                         "report.text(traces=True) has all)"] + tr[-TRACE_LINES // 2:]
        lines += [pad + "| " + ln for ln in tr]
    return lines


def report_text(report, traces: bool = False) -> str:
    lines = [report.summary()]
    for note in report.notes:
        lines += _wrap(note, "  ", "    ")
    for f in report.findings:
        lines += [""] + finding_text(f, traces)
    return "\n".join(lines)


def _cell(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")


# Every cell carries its own style: JupyterLab's CSS right-aligns table cells and centres headers,
# and colours come from the theme (inherit), so the table reads the same in light and dark themes.
_CELL = ("text-align:left;vertical-align:top;padding:4px 8px;"
         "border-bottom:1px solid rgba(128,128,128,0.35);color:inherit;background:transparent")
_HEAD = _CELL + ";font-weight:bold;border-bottom:2px solid rgba(128,128,128,0.6)"
_NOWRAP = "white-space:nowrap"
_LIST = "margin:0;padding-left:1.2em;text-align:left"


def _td(content: str, extra: str = "") -> str:
    return cell(content, _CELL + (";" + extra if extra else ""), quote="'")


def _row(f) -> str:
    ev = "".join(f"<li style='text-align:left'>{_cell(e)}</li>" for e in f.evidence)
    ev = f"<ul style='{_LIST}'>{ev}</ul>" if ev else ""
    if f.where:
        ev = f"<code>{_cell(f.where)}</code>" + ev
    if f.trace:
        ev += (f"<details style='text-align:left'><summary>trace</summary><pre style='font-size:"
               f"85%;text-align:left;white-space:pre-wrap'>{html.escape(f.trace)}</pre></details>")
    sev = f"<b style='color:{COLOUR[f.severity]}'>{f.severity}</b>"
    lesson = f"{f.lesson}<br><small>{_cell(f.error_class)}</small>"
    finding = f"<code style='{_NOWRAP}'>{_cell(f.code)}</code><br>{_cell(f.title)}"
    if only := strategy_names(f.strategies):
        finding += f"<br><small>{_cell(only)}</small>"
    return (f"<tr>{_td(sev, _NOWRAP)}{_td(lesson, 'min-width:7em')}{_td(finding, 'min-width:14em')}"
            f"{_td(ev)}{_td(_cell(f.fix), 'min-width:12em')}</tr>")


def report_html(report) -> str:
    head = f"<p style='text-align:left'><b>{_cell(report.summary())}</b></p>"
    if report.notes:
        notes = "".join(f"<li>{_cell(n)}</li>" for n in report.notes)
        head += f"<ul style='{_LIST};font-size:90%'>{notes}</ul>"
    if not report.findings:
        return head
    columns = ("severity", "lesson", "finding", "evidence", "fix")
    return head + table(columns, [_row(f) for f in report.findings], header_style=_HEAD, quote="'",
                        style="border-collapse:collapse;text-align:left;margin:0;table-layout:auto")
