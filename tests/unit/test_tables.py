"""The one table renderer escapes what would break a Markdown row or inject HTML."""

from __future__ import annotations

from searchrl.tables import Cell, html_table, markdown_table


def test_markdown_table_escapes_pipes_and_newlines() -> None:
    assert markdown_table(["a", "b|c"], [["x|y", "line 1\nline 2"], [1, Cell("z", "ev")]]) == (
        "| a | b\\|c |\n|---|---|\n| x\\|y | line 1 line 2 |\n| 1 | z |")


def test_html_table_escapes_headers_cells_and_classes() -> None:
    out = html_table(["<h>"], [["<script>&"], [Cell("ok", 'ev" onload="x')], [Cell(3)]])
    assert out == ('<table><thead><tr><th>&lt;h&gt;</th></tr></thead><tbody>'
                   '<tr><td>&lt;script&gt;&amp;</td></tr>'
                   '<tr><td class="ev&quot; onload=&quot;x">ok</td></tr>'
                   '<tr><td>3</td></tr></tbody></table>')
