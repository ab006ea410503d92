"""Steward overrides: accept a flagged row, or correct its gold answer, with a reason.

File format (YAML list; `split` optional, it narrows a match when ids repeat across splits):

    - id: 5a77ec115542992a6e59dff7
      action: correct            # or: accept
      golden_answers: [a spirit]  # correct only
      reason: "annotator typo, checked against the supporting passage"
      steward: jdoe
      decided_at: "2025-01-31T12:00:00+00:00"  # optional; apply-audit sets it
      source: audit:test/5a77ec115542992a6e59dff7  # optional; where the decision came from

`correct` replaces the gold answers before any check runs, so the corrected row is checked
like any other. `accept` keeps a flagged row out of quarantine; it cannot waive a contract,
schema or duplicate-id failure (such a row cannot be used as it stands: correct the source).

`merge_audit_decisions` (the `apply-audit` command) appends the decisions a steward made on the
label-noise audit's suspect rows (`searchrl.eval.audit`; the edited JSONL, or the Label Studio
project's JSON export, `searchrl.eval.label_studio`) to this file: never rewriting or
deleting an entry, and a decision already present is not added twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from searchrl.datasets.io import read_user_text
from searchrl.locks import held

NonBlank = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


MERGE_WAIT_S = 60.0  # how long apply-audit waits for another one merging into the file


class OverridesError(ValueError):
    """The overrides file is unreadable or an entry is invalid; names file, entry and field."""


class Override(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: NonBlank
    split: NonBlank | None = None
    action: Literal["accept", "correct"]
    golden_answers: tuple[NonBlank, ...] | None = Field(default=None, min_length=1)
    reason: NonBlank
    steward: NonBlank
    decided_at: NonBlank | None = None
    source: NonBlank | None = None

    def matches(self, split: str, row_id: str | None) -> bool:
        return row_id == self.id and (self.split is None or self.split == split)


@dataclass(frozen=True)
class AppliedOverride:
    """An override applied to one row, for the report and the quarantine file."""

    override: Override
    split: str
    row: int
    previous_answers: tuple[str, ...] | None = None
    effect: str = ""


def load_overrides(path: Path | None) -> list[Override]:
    """Parse and check the overrides file; None -> no overrides. A missing file is an error
    (a mistyped path must not silently drop the stewards' decisions)."""
    if path is None:
        return []
    path = Path(path)
    if not path.is_file():
        raise OverridesError(f"{path}: overrides file not found (validate.overrides_path); "
                             "create it (an empty list `[]` is fine) or set it to null")
    text = read_user_text(path, "overrides file (validate.overrides_path)", OverridesError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OverridesError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, list):
        raise OverridesError(f"{path}: expected a YAML list of overrides, "
                             f"got {type(data).__name__}")
    out: list[Override] = []
    for i, entry in enumerate(data, start=1):
        label = f"{path}: entry {i}"
        if isinstance(entry, dict) and "id" in entry:
            label += f" (id {entry['id']!r})"
        try:
            item = Override.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            fld = ".".join(str(p) for p in first["loc"]) or "<entry>"
            raise OverridesError(f"{label}: field {fld!r}: {first['msg']}") from exc
        if item.action == "correct" and not item.golden_answers:
            raise OverridesError(f"{label}: field 'golden_answers': required for action "
                                 "'correct' (the corrected gold answers)")
        if item.action == "accept" and item.golden_answers is not None:
            raise OverridesError(f"{label}: field 'golden_answers': only allowed for action "
                                 "'correct' (use action: correct to change the answer)")
        out.append(item)
    keys = [(o.id, o.split) for o in out]
    dupes = sorted({k for k in keys if keys.count(k) > 1}, key=str)
    if dupes:
        raise OverridesError(f"{path}: more than one override for {dupes}; keep one per row")
    return out


# --- decisions from the label-noise audit

AUDIT_DECISIONS = ("accept", "correct")  # "" or "skip": not decided yet
_YAML_WIDTH = 1000  # one line per field: a wrapped reason is hard to read and to diff


@dataclass
class MergeResult:
    """What `merge_audit_decisions` did: overrides appended, decision rows already present,
    rows not merged because an override for the row says otherwise, rows left undecided."""

    added: list[Override] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    undecided: int = 0


def _audit_override(row: dict[str, Any], label: str, steward: str | None, now: str) -> Override:
    decision = str(row.get("decision") or "").strip()
    if decision not in AUDIT_DECISIONS:
        raise OverridesError(f"{label}: field 'decision': {decision!r} is not one of "
                             f"{[*AUDIT_DECISIONS, 'skip', '']}")
    for name in ("example_id", "split", "key"):
        if not str(row.get(name) or "").strip():
            raise OverridesError(f"{label}: field {name!r} is missing: pass the audit's "
                                 "suspect_labels*.jsonl rows, edited only in decision, "
                                 "corrected_answers, reason and steward")
    who = str(row.get("steward") or "").strip() or steward
    if not who:
        raise OverridesError(f"{label}: field 'steward' is empty: fill it in, or pass "
                             "--steward NAME")
    answers: list[str] | None = None
    if decision == "correct":
        answers = [str(a) for a in row.get("corrected_answers") or [] if str(a).strip()]
        answers = answers or ([str(row["answer"])] if str(row.get("answer") or "").strip()
                              else [])
        if not answers:
            raise OverridesError(f"{label}: field 'corrected_answers': required for decision "
                                 "'correct' when the row has no policy answer")
    reason = str(row.get("reason") or "").strip() or (
        f"label-noise audit ({row.get('tier', 'suspect')}): gold "
        f"{' / '.join(str(g) for g in row.get('golden_answers') or [])} vs policy answer "
        f"{row.get('answer')}; "
        + ("gold corrected" if decision == "correct" else "gold checked and kept"))
    try:
        return Override(id=str(row["example_id"]), split=str(row["split"]), action=decision,
                        golden_answers=tuple(answers) if answers else None, reason=reason,
                        steward=who, decided_at=str(row.get("decided_at") or "") or now,
                        source=str(row.get("source") or "") or f"audit:{row['key']}")
    except ValidationError as exc:
        first = exc.errors()[0]
        fld = ".".join(str(p) for p in first["loc"]) or "<row>"
        raise OverridesError(f"{label}: field {fld!r}: {first['msg']}") from exc


def _same_decision(a: Override, b: Override) -> bool:
    return a.action == b.action and a.golden_answers == b.golden_answers


def _entry(o: Override) -> dict[str, Any]:
    return o.model_dump(mode="json", exclude_none=True)


def merge_audit_decisions(decisions_path: Path, overrides_path: Path, *,
                          steward: str | None = None, now: datetime | None = None
                          ) -> MergeResult:
    """Append the decided rows of an audit suspects file (JSONL; the steward fills `decision`
    with accept | correct, optionally `corrected_answers` (default: the policy's answer),
    `reason` and `steward`) to the overrides file, as `accept` (the gold was checked and is
    right) or `correct` (replace the gold) overrides of the row's split and id.

    Idempotent: a row whose decision an override of that row already records is left alone;
    a row an existing override decides differently is a conflict, reported and not merged
    (edit the overrides file by hand to change a decision). Existing entries and comments are
    kept as written; the file is replaced atomically, and only when something is added.
    """
    when = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    # Two stewards at once: the second waits for the first's file, then merges against it
    # (its conflicts found), never over it.
    with held(overrides_path, busy="another apply-audit merges into this overrides file",
              wait_s=MERGE_WAIT_S):
        existing = load_overrides(overrides_path) if overrides_path.is_file() else []
        result = MergeResult()
        for label, row in _decision_rows(decisions_path):
            if row.get("conflict"):  # stewards disagree within the file (Label Studio)
                result.conflicts.append(f"{row['key']}: {row['conflict']}")
                continue
            if str(row.get("decision") or "").strip() in ("", "skip"):
                result.undecided += 1
                continue
            new = _audit_override(row, label, steward, when)
            known = [o for o in [*existing, *result.added] if o.matches(str(new.split), new.id)]
            if any(_same_decision(o, new) for o in known):
                result.unchanged.append(str(row["key"]))
            elif known:
                result.conflicts.append(
                    f"{row['key']}: decision {new.action} {list(new.golden_answers or ())} "
                    f"conflicts with the override already in {overrides_path} "
                    f"({known[0].action} {list(known[0].golden_answers or ())} by "
                    f"{known[0].steward}"
                    + (f" at {known[0].decided_at}" if known[0].decided_at else "") + ")")
            else:
                result.added.append(new)
        if result.added:
            _append_overrides(overrides_path, existing, result.added)
    return result


def _decision_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(label, row) per decision: the JSONL rows, or a Label Studio JSON export's tasks."""
    from searchrl.eval.label_studio import (
        LabelStudioExportError,
        is_label_studio_export,
        rows_from_export,
    )

    if is_label_studio_export(path):
        try:
            return rows_from_export(path)
        except LabelStudioExportError as exc:
            raise OverridesError(str(exc)) from exc
    out = []
    text = read_user_text(path, "decisions file (--decisions)", OverridesError)
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        label = f"{path}: line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise OverridesError(f"{label}: not valid JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise OverridesError(f"{label}: expected a JSON object (one suspect row)")
        if not str(row.get("key") or "").strip():  # undecided rows too: a wrong file is
            raise OverridesError(f"{label}: field 'key' is missing: --decisions takes the "
                                 "audit's suspect_labels*.jsonl rows (or a Label Studio JSON "
                                 "export of its project)")
        out.append((label, row))
    return out


def _append_overrides(path: Path, existing: list[Override], added: list[Override]) -> None:
    """Append entries as YAML text, so existing entries and comments stay as written; checked
    by loading the result before it replaces the file."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    block = yaml.safe_dump([_entry(o) for o in added], sort_keys=False, allow_unicode=True,
                           width=_YAML_WIDTH)
    if not existing:  # an empty file is often a bare `[]`: drop it, keep the comments
        kept = [line for line in text.splitlines() if line.strip() not in ("[]", "---")]
        candidate = "".join(f"{line}\n" for line in kept) + block
    else:
        candidate = text.rstrip("\n") + "\n" + block
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(candidate, encoding="utf-8")
    want = [_entry(o) for o in [*existing, *added]]
    try:
        try:
            appended = [_entry(o) for o in load_overrides(tmp)] == want
        except OverridesError:
            appended = False
        if not appended:
            # A flow-style list (`[{...}]`) cannot be appended to as text: re-emit it whole,
            # keeping the comment lines.
            header = "".join(f"{line}\n" for line in text.splitlines()
                             if line.startswith("#"))
            tmp.write_text(header + yaml.safe_dump(want, sort_keys=False, allow_unicode=True,
                                                   width=_YAML_WIDTH), encoding="utf-8")
            load_overrides(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
