"""Validation's suspects as a steward queue: the rows validation flagged but kept (a gold answer
in none of its supporting passages, a near-duplicate question, ...: checks outside
`validate.quarantine_checks`), in the label-noise audit's row format, so the same Label Studio
project, export and `apply-audit` serve both queues.

    <validate dir>/suspect_labels_validation.jsonl             the rows (tier gold_possibly_wrong)
    <validate dir>/suspect_labels_validation.label_studio.json  the Label Studio import

The evidence a steward reads is each flag's reason and detail (the passages it quoted). No
policy has answered these questions yet, so a `correct` decision needs corrected answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from searchrl.datasets.io import atomic_write_text, read_qa
from searchrl.eval.audit import GOLD_POSSIBLY_WRONG
from searchrl.eval.label_studio import write_label_studio

QUEUE_FILE = "suspect_labels_validation.jsonl"


def validation_suspects(validate_dir: Path) -> list[dict[str, Any]]:
    """One audit row per clean row that validation flagged (audit.json's flags), in split
    and row order."""
    audit_path = validate_dir / "audit.json"
    if not audit_path.is_file():
        raise FileNotFoundError(f"{audit_path}: no validation audit here; run the validate "
                                "stage first (python -m searchrl validate --config ...)")
    flags: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for flag in json.loads(audit_path.read_text(encoding="utf-8")).get("flags") or []:
        if flag.get("id") is not None:
            flags.setdefault((str(flag["split"]), str(flag["id"])), []).append(flag)
    rows: list[dict[str, Any]] = []
    for split in dict.fromkeys(split for split, _ in flags):
        clean = validate_dir / f"{split.replace(':', '_')}.jsonl"
        if not clean.is_file():
            continue
        for example in read_qa(clean):
            found = flags.get((split, example.id))
            if not found:
                continue  # not flagged, or flagged and quarantined (not in the clean split)
            rows.append({
                "key": f"{split}/{example.id}", "split": split, "example_id": example.id,
                "question": example.question, "golden_answers": list(example.golden_answers),
                "answer": "", "tier": GOLD_POSSIBLY_WRONG, "score": float(len(found)),
                "rank": len(rows) + 1, "confidence": None, "agreement": None,
                "gold_doc": ", ".join(f["check"] for f in found),
                "gold_snippet": " | ".join(
                    f["reason"] + (f" ({f['detail']})" if f.get("detail") else "")
                    for f in found),
                "decision": "", "corrected_answers": [], "reason": "", "steward": ""})
    return rows


def write_validation_queue(validate_dir: Path) -> Path:
    """The queue's JSONL and its Label Studio import beside validation's outputs; the JSONL."""
    rows = validation_suspects(validate_dir)
    path = validate_dir / QUEUE_FILE
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    write_label_studio(path, rows)
    return path
