"""Gold-set drift: a second validation of an edited copy of the planted-defect world reports
exactly the rows and passages added, removed and changed against the first one (or against
the champion's digest once the gate kept one), warns past `validate.drift_warn_fraction`,
and writes it into the audit report and the metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.validation.drift import history_dir, keep_digest
from searchrl.validation.validate import validate_gold_labels
from tests.contracts.conftest import DEFECTS, ROOT


def _config(tmp_path: Path, data: Path, **validate: Any) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"name": "drift", "work_dir": str(tmp_path / "run")},
        "data": {"source": "files", **{f"{s}_path": str(data / f"{s}.jsonl")
                                       for s in ("train", "dev", "test", "corpus")}},
        "validate": {"max_quarantine_fraction": 1.0, "overrides_path": None,
                     "eval_requires_hops": True,
                     "contracts_dir": str(ROOT / "data_contracts"), **validate},
    })


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_world(data: Path) -> None:
    """t1's answer changed, t5 removed (t6 no longer duplicates it), t20 (2-hop) added; p3
    edited, p7 added."""
    train = [r for r in _rows(data / "train.jsonl") if r["id"] != "t5"]
    for r in train:
        if r["id"] == "t1":
            r["golden_answers"] = ["the capital of France"]
    train.append({"id": "t20", "question": "What is the capital of the country of Paris?",
                  "golden_answers": ["Paris"], "hops": 2, "type": "bridge",
                  "supporting_doc_ids": ["p1"]})
    _write(data / "train.jsonl", train)
    corpus = _rows(data / "corpus.jsonl")
    for r in corpus:
        if r["id"] == "p3":
            r["contents"] += " It was first climbed in 1901."
    corpus.append({"id": "p7", "title": "Extra", "contents": "An unrelated new passage."})
    _write(data / "corpus.jsonl", corpus)


def test_drift_against_last_then_champion(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(DEFECTS, data)
    first = validate_gold_labels(_config(tmp_path, data), tmp_path / "v1")
    assert first.drift is None
    assert first.report_md is not None
    assert "No reference gold set yet" in first.report_md.read_text()
    assert (history_dir(tmp_path / "run") / "last" / "qa.json").is_file()

    _edit_world(data)
    second = validate_gold_labels(_config(tmp_path, data, drift_warn_fraction=0.2),
                                  tmp_path / "v2")
    drift = second.drift
    assert drift is not None and drift.reference.startswith("last")
    sets = {(s.kind, s.name): s for s in drift.sets}
    train = sets[("qa", "train")]
    # added: t20, and t6, quarantined as t5's duplicate question until t5 went
    assert (train.added, train.removed, train.changed, train.answers_changed) == (2, 1, 1, 1)
    assert (sets[("qa", "test")].added, sets[("qa", "test")].changed) == (0, 0)
    corpus = sets[("corpus", "corpus")]
    assert (corpus.old, corpus.new, corpus.added, corpus.removed, corpus.changed) == (
        6, 7, 1, 0, 1)
    assert drift.hop_mix["train"][1].get("2", 0) > drift.hop_mix["train"][0].get("2", 0)
    # train: 4 of its clean rows moved (> 20%); the corpus: 2 of 6 passages (> 20%)
    assert [w.split("'")[1] for w in drift.warnings] == ["train", "corpus"]
    metrics = second.metrics()
    assert metrics["drift_warnings"] == 2
    assert metrics["drift.qa.train.answers_changed"] == 1
    assert second.report_md is not None and second.report_html is not None
    md = second.report_md.read_text()
    assert "## Drift since the reference gold set" in md and "**Warning:** qa 'train'" in md
    assert "Warning: corpus" in second.report_html.read_text()
    assert second.audit_path is not None
    assert len(json.loads(second.audit_path.read_text())["drift"]["warnings"]) == 2

    # The gate kept the first run's digest as the champion's: measured against that, not
    # against the last (identical) validation.
    assert first.digest_dir is not None
    keep_digest(first.digest_dir, history_dir(tmp_path / "run") / "champion")
    third = validate_gold_labels(_config(tmp_path, data), tmp_path / "v3")
    assert third.drift is not None and third.drift.reference.startswith("champion")
    assert {(s.name, s.changed) for s in third.drift.sets if s.kind == "corpus"} == {
        ("corpus", 1)}
