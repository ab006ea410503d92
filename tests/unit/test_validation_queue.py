"""Validation's suspects (flagged rows it kept) as a steward queue in the audit's row format:
each flagged clean row once, with its flags as the evidence, none of the quarantined or
unflagged rows; the same apply-audit takes the steward's decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.eval.validation_queue import QUEUE_FILE, validation_suspects, write_validation_queue
from searchrl.validation.overrides import OverridesError, load_overrides, merge_audit_decisions
from searchrl.validation.validate import validate_gold_labels
from tests.contracts.conftest import make_defects_config


@pytest.fixture(scope="module")
def validate_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("validation_queue")
    validate_gold_labels(make_defects_config(tmp), tmp / "v")
    return tmp / "v"


def test_flagged_kept_rows_with_their_evidence(validate_dir: Path) -> None:
    queue = write_validation_queue(validate_dir)
    assert queue.name == QUEUE_FILE
    rows = {r["key"]: r for r in map(json.loads, queue.read_text().splitlines())}
    assert "train/t10" in rows and "train/t12" in rows
    assert "train/t11" not in rows  # quarantined (a supporting passage in no corpus)
    assert "train/t1" not in rows  # nothing flagged
    t10 = rows["train/t10"]
    assert t10["golden_answers"] == ["Orin Tal"] and t10["gold_doc"] == "not_in_supporting"
    tasks = json.loads(queue.with_name("suspect_labels_validation.label_studio.json")
                       .read_text())
    evidence = next(t["data"]["evidence"] for t in tasks if t["data"]["key"] == "train/t10")
    assert "in none of the supporting passages ['p4']" in evidence and "[p5]" in evidence
    assert validation_suspects(validate_dir) == list(rows.values())


def test_decisions_apply_like_the_audits(validate_dir: Path, tmp_path: Path) -> None:
    rows = validation_suspects(validate_dir)
    t10 = next(r for r in rows if r["key"] == "train/t10")
    decided = tmp_path / "decided.jsonl"
    decided.write_text(json.dumps({**t10, "decision": "accept", "steward": "ana",
                                   "reason": "p5 supports it; the supporting ids are wrong"})
                       + "\n")
    overrides = tmp_path / "overrides.yaml"
    assert [o.id for o in merge_audit_decisions(decided, overrides).added] == ["t10"]
    (entry,) = load_overrides(overrides)
    assert (entry.action, entry.steward, entry.source) == ("accept", "ana", "audit:train/t10")
    decided.write_text(json.dumps({**t10, "decision": "correct", "steward": "bo"}) + "\n")
    with pytest.raises(OverridesError, match="field 'corrected_answers': required"):
        merge_audit_decisions(decided, tmp_path / "other.yaml")


def test_no_validation_yet_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"audit.json: no validation audit here"):
        validation_suspects(tmp_path)
