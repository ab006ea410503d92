"""The data steward's audit report: one `Audit`, rendered as Markdown and as a self-contained
HTML page (inline CSS, no scripts, no external assets), so it opens from an MLflow artifact view
or an e-mail attachment as is.

Sections: summary counts, per split, per check (what it means, whether it quarantines), the
data-contract results, the steward overrides applied (and any that matched nothing), then every
flagged row with question, gold answer, reason, evidence and what happened to it.
"""

from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from searchrl.tables import Cell, html_table, markdown_table
from searchrl.validation.checks import CHECK_DESCRIPTIONS, Flag
from searchrl.validation.drift import DRIFT_HEADER, MIX_HEADER, DriftReport, drift_rows, mix_rows
from searchrl.validation.overrides import AppliedOverride, Override
from searchrl.validation.suites import SuiteResult


@dataclass
class RowOutcome:
    """What validation decided for one input row."""

    split: str
    file: str
    row: int
    record: dict[str, Any]
    flags: list[Flag] = field(default_factory=list)
    quarantined: bool = False
    overrides: list[AppliedOverride] = field(default_factory=list)

    @property
    def id(self) -> str | None:
        value = self.record.get("id")
        return None if value is None else str(value)

    @property
    def status(self) -> str:
        if self.quarantined:
            return "quarantined"
        if any(o.override.action == "accept" and o.effect.startswith("accepted")
               for o in self.overrides):
            return "accepted by steward"
        return "review" if self.flags else "clean"


@dataclass
class Audit:
    """Everything the report shows; also written as JSON next to it."""

    title: str
    counts: dict[str, int]
    split_counts: dict[str, dict[str, int]]
    check_rows: dict[str, int]
    quarantine_checks: tuple[str, ...]
    max_quarantine_fraction: float
    suites: list[SuiteResult]
    outcomes: list[RowOutcome]
    unused_overrides: list[Override]
    notes: list[str] = field(default_factory=list)
    # Against the champion's (else the last) validated gold set; None: nothing to compare to.
    drift: DriftReport | None = None

    @property
    def quarantine_fraction(self) -> float:
        return self.counts["quarantined"] / max(self.counts["rows_in"], 1)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _answers(record: dict[str, Any]) -> str:
    answers = record.get("golden_answers")
    if isinstance(answers, list | tuple):
        return " / ".join(str(a) for a in answers)
    return "" if answers is None else str(answers)


def _override_text(applied: AppliedOverride) -> str:
    o = applied.override
    return f"{o.action} by {o.steward}: {o.reason} ({applied.effect})"


def _flagged_rows(audit: Audit) -> dict[str, list[tuple[RowOutcome, Flag]]]:
    by_check: dict[str, list[tuple[RowOutcome, Flag]]] = {}
    for outcome in audit.outcomes:
        for flag in outcome.flags:
            by_check.setdefault(flag.check, []).append((outcome, flag))
    order = list(CHECK_DESCRIPTIONS)
    return dict(sorted(by_check.items(), key=lambda kv: order.index(kv[0])
                       if kv[0] in order else len(order)))


def _summary_rows(audit: Audit) -> list[tuple[str, str]]:
    c = audit.counts
    return [
        ("rows in", str(c["rows_in"])),
        ("clean (go on to training / evaluation)", str(c["clean"])),
        ("quarantined", f"{c['quarantined']} ({audit.quarantine_fraction:.1%}; the stage fails "
                        f"above {audit.max_quarantine_fraction:.0%})"),
        ("clean rows flagged for review", str(c["review"])),
        ("accepted by a steward", str(c["accepted"])),
        ("corrected by a steward", str(c["corrected"])),
        ("overrides that matched no row", str(c["unused_overrides"])),
    ]


def _contract_lines(audit: Audit) -> list[tuple[str, str, str, str, str]]:
    """(dataset, suite, expectation, field: rule, result) for every failed expectation."""
    out = []
    for s in audit.suites:
        for o in s.outcomes:
            if not o.success:
                out.append((s.dataset, s.suite, o.expectation, f"{o.field}: {o.rule}",
                            f"{o.unexpected_count} row(s) fail"))
    return out


# --- markdown


def _md_table(header: list[str], rows: list[list[Any]], limit: int = 400) -> list[str]:
    return markdown_table(header, [[_cut(str(c), limit) for c in r] for r in rows]).split("\n")


def _drift_markdown(drift: DriftReport | None) -> list[str]:
    out = ["", "## Drift since the reference gold set", ""]
    if drift is None:
        return [*out, "No reference gold set yet (first validated run in this work dir)."]
    out += [f"Reference: {drift.reference}.", ""]
    out += [f"**Warning:** {w}" for w in drift.warnings] + ([""] if drift.warnings else [])
    return [*out, *_md_table(DRIFT_HEADER, drift_rows(drift)), "",
            *_md_table(MIX_HEADER, mix_rows(drift))]


def render_markdown(audit: Audit) -> str:
    """The audit as GitHub-flavoured Markdown."""
    out = [f"# {audit.title}", ""]
    out += ["## Summary", "", *_md_table(["", "rows"], [list(r) for r in _summary_rows(audit)])]
    out += ["", "## Per split", "", *_md_table(
        ["split", "rows in", "clean", "quarantined", "flagged for review"],
        [[s, c["rows_in"], c["clean"], c["quarantined"], c["review"]]
         for s, c in audit.split_counts.items()])]
    out += _drift_markdown(audit.drift)
    out += ["", "## Checks", "", *_md_table(
        ["check", "action", "rows flagged", "what it means"],
        [[k, "quarantine" if k in audit.quarantine_checks else "review",
          audit.check_rows.get(k, 0), d] for k, d in CHECK_DESCRIPTIONS.items()])]
    n_exp = sum(len(s.outcomes) for s in audit.suites)
    n_ok = sum(o.success for s in audit.suites for o in s.outcomes)
    out += ["", "## Data contracts (Great Expectations)", "",
            f"{n_ok} of {n_exp} expectations passed over {len(audit.suites)} datasets "
            f"({', '.join(f'{s.dataset}: {s.suite}' for s in audit.suites)})."]
    failed = _contract_lines(audit)
    if failed:
        out += ["", *_md_table(["dataset", "suite", "expectation", "rule", "result"],
                               [list(f) for f in failed])]
    out += ["", "## Steward overrides", ""]
    applied = [(o, a) for o in audit.outcomes for a in o.overrides]
    if applied:
        out += _md_table(["split", "row", "id", "action", "steward", "reason", "effect"],
                         [[o.split, o.row, o.id, a.override.action, a.override.steward,
                           a.override.reason, a.effect] for o, a in applied])
    else:
        out.append("No overrides applied.")
    if audit.unused_overrides:
        out += ["", "Overrides that matched no row (stale? check the id): " + ", ".join(
            f"`{u.id}`" + (f" ({u.split})" if u.split else "") for u in audit.unused_overrides)]
    for note in audit.notes:
        out += ["", f"> {note}"]
    out += ["", "## Flagged rows"]
    for check, items in _flagged_rows(audit).items():
        action = "quarantine" if check in audit.quarantine_checks else "review"
        out += ["", f"### {check} ({len(items)} flags, {action})", "",
                CHECK_DESCRIPTIONS.get(check, ""), ""]
        out += _md_table(
            ["split", "row", "id", "question", "gold answer", "reason", "evidence", "status"],
            [[o.split, o.row, o.id, o.record.get("question"), _answers(o.record), f.reason,
              f.detail, o.status + "".join(f"; {_override_text(a)}" for a in o.overrides)]
             for o, f in items])
    return "\n".join(out) + "\n"


# --- html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222}
h1{font-size:1.6em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}h3{margin-top:1.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em;width:100%}
th,td{border:1px solid #ccc;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.ev{font-family:ui-monospace,monospace;font-size:.85em;max-width:40em}
.quarantined{color:#a40000;font-weight:600}.review{color:#8a5a00}
.accepted{color:#005a9e}.clean{color:#1a7f37}.muted{color:#666}
blockquote{border-left:4px solid #ddd;margin:0;padding-left:1em;color:#555}
"""


def _h(text: Any, limit: int = 600) -> str:
    return html.escape(_cut(str(text), limit))


def _td(text: Any, cls: str = "", limit: int = 600) -> Cell:
    return Cell(_cut(str(text), limit), cls)


def _status_class(status: str) -> str:
    return status.split()[0] if status.split() else ""


def _drift_html(drift: DriftReport | None) -> list[str]:
    out = ["<h2>Drift since the reference gold set</h2>"]
    if drift is None:
        return [*out, "<p class='muted'>No reference gold set yet (first validated run in "
                      "this work dir).</p>"]
    out += [f"<p>Reference: {_h(drift.reference, 2000)}.</p>"]
    out += [f"<p class='quarantined'>Warning: {_h(w, 2000)}</p>" for w in drift.warnings]
    return [*out, html_table(DRIFT_HEADER, [[_td(c) for c in r] for r in drift_rows(drift)]),
            html_table(MIX_HEADER, [[_td(c) for c in r] for r in mix_rows(drift)])]


def render_html(audit: Audit) -> str:
    """The audit as one self-contained HTML page."""
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>{_h(audit.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{_h(audit.title)}</h1>", "<h2>Summary</h2>",
             html_table(["", "rows"], [[_td(k), _td(v)] for k, v in _summary_rows(audit)]),
             "<h2>Per split</h2>",
             html_table(["split", "rows in", "clean", "quarantined", "flagged for review"],
                         [[_td(s), _td(c["rows_in"]), _td(c["clean"]), _td(c["quarantined"]),
                           _td(c["review"])] for s, c in audit.split_counts.items()]),
             *_drift_html(audit.drift),
             "<h2>Checks</h2>",
             html_table(["check", "action", "rows flagged", "what it means"],
                         [[_td(k), _td("quarantine" if k in audit.quarantine_checks
                                       else "review"),
                           _td(audit.check_rows.get(k, 0)), _td(d)]
                          for k, d in CHECK_DESCRIPTIONS.items()])]
    n_exp = sum(len(s.outcomes) for s in audit.suites)
    n_ok = sum(o.success for s in audit.suites for o in s.outcomes)
    parts += ["<h2>Data contracts (Great Expectations)</h2>",
              f"<p>{n_ok} of {n_exp} expectations passed over {len(audit.suites)} datasets "
              f"({_h(', '.join(f'{s.dataset}: {s.suite}' for s in audit.suites), 2000)}).</p>"]
    failed = _contract_lines(audit)
    if failed:
        parts.append(html_table(["dataset", "suite", "expectation", "rule", "result"],
                                 [[_td(c) for c in f] for f in failed]))
    parts.append("<h2>Steward overrides</h2>")
    applied = [(o, a) for o in audit.outcomes for a in o.overrides]
    if applied:
        parts.append(html_table(
            ["split", "row", "id", "action", "steward", "reason", "effect"],
            [[_td(o.split), _td(o.row), _td(o.id), _td(a.override.action),
              _td(a.override.steward), _td(a.override.reason), _td(a.effect)]
             for o, a in applied]))
    else:
        parts.append("<p class='muted'>No overrides applied.</p>")
    if audit.unused_overrides:
        parts.append("<p>Overrides that matched no row (stale? check the id): " + ", ".join(
            f"<code>{_h(u.id)}</code>" for u in audit.unused_overrides) + "</p>")
    parts += [f"<blockquote>{_h(n, 2000)}</blockquote>" for n in audit.notes]
    parts.append("<h2>Flagged rows</h2>")
    flagged = _flagged_rows(audit)
    if not flagged:
        parts.append("<p class='clean'>No row was flagged.</p>")
    for check, items in flagged.items():
        action = "quarantine" if check in audit.quarantine_checks else "review"
        parts.append(f"<h3 id='{_h(check)}'>{_h(check)} ({len(items)} flags, {action})</h3>"
                     f"<p class='muted'>{_h(CHECK_DESCRIPTIONS.get(check, ''))}</p>")
        rows = []
        for o, f in items:
            status = o.status
            extra = "".join(f"; {_override_text(a)}" for a in o.overrides)
            rows.append([_td(o.split), _td(o.row), _td(o.id), _td(o.record.get("question")),
                         _td(_answers(o.record)), _td(f.reason), _td(f.detail, "ev", 1200),
                         _td(status + extra, _status_class(status))])
        parts.append(html_table(["split", "row", "id", "question", "gold answer", "reason",
                                  "evidence", "status"], rows))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def check_row_counts(outcomes: list[RowOutcome]) -> dict[str, int]:
    """Rows flagged per check (a row counted once per check)."""
    counter: Counter[str] = Counter()
    for o in outcomes:
        for check in {f.check for f in o.flags}:
            counter[check] += 1
    return dict(counter)
