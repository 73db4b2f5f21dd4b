"""A `Report` as text for a terminal and as an HTML table for Jupyter."""
from __future__ import annotations

import html
import textwrap

MARK = {"error": "ERROR", "warning": "WARN ", "info": "info "}
COLOUR = {"error": "#c0392b", "warning": "#d68910", "info": "#2471a3"}
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
    lines = [f"{MARK[f.severity]}  [{f.lesson} {f.error_class}] {f.code}: {f.title}"]
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


def _row(f) -> str:
    ev = "".join(f"<li>{_cell(e)}</li>" for e in f.evidence)
    ev = f"<ul style='margin:0;padding-left:1.2em'>{ev}</ul>" if ev else ""
    if f.trace:
        ev += (f"<details><summary>trace</summary><pre style='font-size:85%'>"
               f"{html.escape(f.trace)}</pre></details>")
    sev = f"<b style='color:{COLOUR[f.severity]}'>{f.severity}</b>"
    return (f"<tr><td>{sev}</td><td>{f.lesson}<br><small>{_cell(f.error_class)}</small></td>"
            f"<td><code>{_cell(f.code)}</code><br>{_cell(f.title)}</td>"
            f"<td style='text-align:left'>{ev}</td><td style='text-align:left'>{_cell(f.fix)}</td></tr>")


def report_html(report) -> str:
    head = f"<p><b>{_cell(report.summary())}</b></p>"
    if not report.findings:
        return head
    cols = "".join(f"<th>{c}</th>" for c in ("severity", "lesson", "finding", "evidence", "fix"))
    rows = "".join(_row(f) for f in report.findings)
    return (f"{head}<table style='border-collapse:collapse;text-align:left'>"
            f"<thead><tr>{cols}</tr></thead><tbody>{rows}</tbody></table>")
