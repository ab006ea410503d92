"""Steward overrides: accept a flagged row, or correct its gold answer, with a reason.

File format (YAML list; `split` optional, it narrows a match when ids repeat across splits):

    - id: 5a77ec115542992a6e59dff7
      action: correct            # or: accept
      golden_answers: [a spirit]  # correct only
      reason: "annotator typo, checked against the supporting passage"
      steward: jdoe

`correct` replaces the gold answers before any check runs, so the corrected row is checked
like any other. `accept` keeps a flagged row out of quarantine; it cannot waive a contract,
schema or duplicate-id failure (such a row cannot be used as it stands: correct the source).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

NonBlank = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


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
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
