"""Tables for the reports, as GitHub-flavoured Markdown and as HTML, escaped in one place.

Cells are any objects (rendered with `str`); an HTML cell that needs a CSS class is a `Cell`.
Truncating long text is the caller's business: escaping happens after it, so a cut never
splits an escape sequence.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """A cell with a CSS class (HTML only; Markdown renders the text)."""

    text: object
    cls: str = ""


def _text(cell: object) -> str:
    return str(cell.text if isinstance(cell, Cell) else cell)


def _md_cell(cell: object) -> str:
    # A `|` would end the cell and a newline the row.
    return " ".join(_text(cell).replace("|", "\\|").splitlines())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GFM pipe table (no trailing newline)."""
    lines = ["| " + " | ".join(_md_cell(h) for h in header) + " |",
             "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _td(cell: object) -> str:
    cls = f' class="{html.escape(cell.cls)}"' if isinstance(cell, Cell) and cell.cls else ""
    return f"<td{cls}>{html.escape(_text(cell))}</td>"


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A `<table>` with a `<thead>` row; every header and cell text is HTML-escaped."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
