"""The audit queue as a Label Studio import (tasks with the tier pre-annotated, a labeling
config that names every field the tasks and results use), and a Label Studio JSON export read
by `apply-audit` like the JSONL (each steward's latest non-cancelled annotation; stewards who
disagree are a conflict; who, when and which annotation recorded). The round trip through a
running Label Studio: tests/flows/test_steward_label_studio.py (slow)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from searchrl.__main__ import main
from searchrl.eval.audit import GOLD_LIKELY_WRONG, POLICY_ERROR, pool_suspects
from searchrl.eval.label_studio import CONFIG_FILE, LABEL_CONFIG, to_tasks, write_label_studio
from searchrl.validation.overrides import OverridesError, load_overrides, merge_audit_decisions

NOW = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


def _suspects() -> list[dict[str, Any]]:
    base = {"confidence": 0.9, "question": "Where was Ada born?", "golden_answers": ["Quellandia"],
            "answer": "Quelland", "answer_doc": "p4", "answer_snippet": "... born in Quelland",
            "gold_doc": None, "gold_snippet": ""}
    return pool_suspects([{**base, "example_id": "t9", "tier": GOLD_LIKELY_WRONG},
                          {**base, "example_id": "t8", "tier": POLICY_ERROR},
                          {**base, "example_id": "t7", "tier": GOLD_LIKELY_WRONG}],
                         {"t9": 1, "t8": 1, "t7": 1}, split="train")


def test_tasks_and_config_agree(tmp_path: Path) -> None:
    rows = _suspects()
    spath = tmp_path / "suspect_labels.jsonl"
    out = write_label_studio(spath, rows)
    assert out.name == "suspect_labels.label_studio.json"
    tasks = json.loads(out.read_text())
    config = ET.fromstring((tmp_path / CONFIG_FILE).read_text())
    assert (tmp_path / CONFIG_FILE).read_text() == LABEL_CONFIG
    controls = {el.get("name"): el for el in config if el.tag in ("Choices", "TextArea")}
    objects = {el.get("name") for el in config if el.tag == "Text"}
    variables = set(re.findall(r"\$(\w+)", LABEL_CONFIG))
    assert len(tasks) == len(rows)
    for task, row in zip(tasks, rows, strict=True):
        assert variables <= task["data"].keys()  # every $var the config shows is in the task
        assert task["data"]["key"] == row["key"] and "born in Quelland" in task["data"]["evidence"]
        (prediction,) = task["predictions"]
        assert prediction["score"] == row["score"]
        (result,) = prediction["result"]
        assert result["to_name"] in objects and result["type"] == "choices"
        tier_choices = {c.get("value") for c in controls[result["from_name"]]}
        assert result["value"]["choices"] == [row["tier"]] and row["tier"] in tier_choices
    decisions = {c.get("value") for c in controls["decision"]}
    assert decisions == {"accept", "correct", "skip"}


def _annotation(decision: str, when: str, *, answers: str = "", reason: str = "",
                who: Any = None, cancelled: bool = False) -> dict[str, Any]:
    result = [{"from_name": "decision", "to_name": "question", "type": "choices",
               "value": {"choices": [decision]}}]
    if answers:
        result.append({"from_name": "corrected_answers", "to_name": "question",
                       "type": "textarea", "value": {"text": [answers]}})
    if reason:
        result.append({"from_name": "reason", "to_name": "question", "type": "textarea",
                       "value": {"text": [reason]}})
    return {"id": hash(when) % 1000, "result": result, "was_cancelled": cancelled,
            "created_at": when, "updated_at": when,
            "completed_by": who if who is not None else 7}


def _export(tmp_path: Path) -> Path:
    """What Label Studio's JSON export of the imported tasks looks like once annotated."""
    tasks = to_tasks(_suspects())
    by_key = {t["data"]["key"]: t for t in tasks}
    by_key["train/t9"]["annotations"] = [  # ana revises her own decision: the later counts
        _annotation("accept", "2025-01-30T10:00:00Z", who={"id": 3, "email": "ana@x.org"}),
        _annotation("correct", "2025-01-30T11:00:00Z", answers="Quelland\nQuelland City",
                    reason="the passage says Quelland", who={"id": 3, "email": "ana@x.org"}),
        _annotation("accept", "2025-01-30T12:00:00Z", cancelled=True)]  # skipped: ignored
    by_key["train/t8"]["annotations"] = [_annotation("accept", "2025-01-30T10:00:00Z")]
    # train/t7: not annotated yet
    for n, task in enumerate(tasks, start=1):
        task |= {"id": n, "project": 1}
    path = tmp_path / "project-1-at-2025.json"
    path.write_text(json.dumps(tasks))
    return path


def test_apply_audit_reads_a_label_studio_export(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    merged = merge_audit_decisions(_export(tmp_path), overrides, now=NOW)
    assert [o.id for o in merged.added] == ["t9", "t8"] and merged.undecided == 1
    loaded = {o.id: o for o in load_overrides(overrides)}
    t9 = loaded["t9"]
    assert (t9.action, t9.golden_answers, t9.steward) == (
        "correct", ("Quelland", "Quelland City"), "ana@x.org")
    assert t9.reason == "the passage says Quelland"
    # the audit trail: who, when (the annotation's time, not the merge's), which annotation
    assert t9.decided_at == "2025-01-30T11:00:00Z"
    assert re.fullmatch(r"label-studio:project 1/task \d+/annotation \d+", str(t9.source))
    assert loaded["t8"].steward == "label-studio-user-7" and loaded["t8"].action == "accept"
    # the CLI takes the export as --decisions too; again: nothing new
    assert main(["apply-audit", "--decisions", str(_export(tmp_path)),
                 f"validate.overrides_path={overrides}"]) == 0


def test_two_stewards_disagreeing_is_a_conflict_not_the_last_write(tmp_path: Path) -> None:
    tasks = to_tasks(_suspects())
    for n, task in enumerate(tasks, start=1):
        task |= {"id": n, "project": 1}
    ana, bo = {"id": 3, "email": "ana@x.org"}, {"id": 4, "email": "bo@x.org"}
    tasks[0]["annotations"] = [_annotation("correct", "2025-01-30T10:00:00Z",
                                           answers="Quelland", who=ana),
                               _annotation("accept", "2025-01-30T11:00:00Z", who=bo)]
    tasks[1]["annotations"] = [_annotation("accept", "2025-01-30T10:00:00Z", who=ana),
                               _annotation("accept", "2025-01-30T11:00:00Z", who=bo),
                               _annotation("skip", "2025-01-30T12:00:00Z", who={"id": 5})]
    export = tmp_path / "export.json"
    export.write_text(json.dumps(tasks))
    overrides = tmp_path / "overrides.yaml"
    merged = merge_audit_decisions(export, overrides, now=NOW)
    (conflict,) = merged.conflicts
    assert conflict.startswith(f"{tasks[0]['data']['key']}: stewards disagree in Label Studio")
    assert "ana@x.org (2025-01-30T10:00:00Z): correct ['Quelland']" in conflict
    assert "bo@x.org (2025-01-30T11:00:00Z): accept []" in conflict
    (agreed,) = merged.added  # two stewards agreeing (a third skipped): both recorded
    assert agreed.steward == "ana@x.org, bo@x.org" and agreed.action == "accept"
    assert [o.id for o in load_overrides(overrides)] == [agreed.id]
    assert main(["apply-audit", "--decisions", str(export),
                 f"validate.overrides_path={overrides}"]) == 1  # conflicts: exit 1


def test_export_without_task_data_names_the_task(tmp_path: Path) -> None:
    bad = tmp_path / "export.json"
    bad.write_text(json.dumps([{"id": 41, "annotations": []}]))
    with pytest.raises(OverridesError, match=r"export.json: task 41: field 'data'"):
        merge_audit_decisions(bad, tmp_path / "o.yaml", now=NOW)
