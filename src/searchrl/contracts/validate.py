"""Stage 1 library entry: materialise the sources, check each QA row, quarantine what fails.

Clean rows go on as `<split>.jsonl`, failing rows go to `quarantine.jsonl` with the reason per
row; clean + quarantined = input is checked before anything is marked complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from searchrl.config import PipelineConfig
from searchrl.data.io import atomic_write_text, read_raw_qa_rows, write_jsonl
from searchrl.data.sources import materialise_sources
from searchrl.types import QAExample


class QuarantineThresholdError(RuntimeError):
    """Too large a share of rows failed validation for the run to go on."""


@dataclass
class ValidationResult:
    out_dir: Path
    split_paths: dict[str, Path]
    corpus_path: Path
    quarantine_path: Path
    counts: dict[str, int] = field(default_factory=dict)
    quarantined: list[dict[str, Any]] = field(default_factory=list)


def _schema_reason(err: ValidationError) -> str:
    first = err.errors()[0]
    return f"schema: field {'.'.join(str(p) for p in first['loc'])!r}: {first['msg']}"


def validate_gold_labels(config: PipelineConfig, out_dir: Path) -> ValidationResult:
    source_paths = materialise_sources(config.data, out_dir / "source")
    clean_paths: dict[str, Path] = {}
    quarantined: list[dict[str, Any]] = []
    counts: dict[str, int] = {"rows_in": 0, "clean": 0, "quarantined": 0}
    for name, path in source_paths.items():
        if name == "corpus" or name.startswith("extra_corpus:"):
            continue
        clean: list[QAExample] = []
        rows = read_raw_qa_rows(path)
        for rowno, raw in rows:
            try:
                clean.append(QAExample.model_validate(raw))
            except ValidationError as exc:
                quarantined.append({"split": name, "file": str(path), "row": rowno,
                                    "reason": _schema_reason(exc), "record": raw})
        n_bad = len(rows) - len(clean)
        if len(clean) + n_bad != len(rows):
            raise AssertionError(f"{path}: clean + quarantined != input")
        counts["rows_in"] += len(rows)
        counts["clean"] += len(clean)
        counts["quarantined"] += n_bad
        safe = name.replace(":", "_")
        clean_paths[name] = out_dir / f"{safe}.jsonl"
        write_jsonl(clean_paths[name], clean)
    quarantine_path = out_dir / "quarantine.jsonl"
    atomic_write_text(quarantine_path, "".join(json.dumps(q, default=str) + "\n"
                                               for q in quarantined))
    share = counts["quarantined"] / max(counts["rows_in"], 1)
    if share > config.validate_.max_quarantine_fraction:
        raise QuarantineThresholdError(
            f"{counts['quarantined']}/{counts['rows_in']} rows ({share:.1%}) quarantined, above "
            f"validate.max_quarantine_fraction={config.validate_.max_quarantine_fraction}; "
            f"see {quarantine_path}"
        )
    return ValidationResult(out_dir=out_dir, split_paths=clean_paths,
                            corpus_path=source_paths["corpus"], quarantine_path=quarantine_path,
                            counts=counts, quarantined=quarantined)
