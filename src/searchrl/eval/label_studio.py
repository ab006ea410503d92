"""The label-noise audit queue as a Label Studio project, and its export back as decisions.

Beside `suspect_labels*.jsonl` the evaluate stage writes, for a steward who works in Label
Studio (https://labelstud.io/guide/task_format, /guide/predictions):

    <name>.label_studio.json   tasks to import: `data` holds what the steward reads (question,
                               gold, policy answer, evidence, the row's key); `predictions`
                               pre-annotate the audit's tier (model_version `searchrl-audit`,
                               score = the row's score), so the queue sorts and filters by it
    label_studio_config.xml    the labeling config: the tier (pre-filled), the decision
                               (accept / correct / skip), corrected answers (one a line), reason

The project's JSON export ("JSON", not "JSON_MIN") is what `apply-audit --decisions` reads
then, like the JSONL: each steward's latest annotation of a task that was not cancelled is
their decision; the stewards agreeing give the row's decision, with who (`completed_by`: its
e-mail when the export has it, else `label-studio-user-<id>`), when (the annotation's time)
and which annotation (`source`) recorded in the override; stewards deciding differently are a
conflict apply-audit reports and does not merge. `label_studio_api` pushes the queue into a
running Label Studio and pulls the export.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from searchrl.datasets.io import atomic_write_text, read_user_text

MODEL_VERSION = "searchrl-audit"
TASKS_SUFFIX = ".label_studio.json"
CONFIG_FILE = "label_studio_config.xml"
# The audit row fields a task carries, so its export rebuilds the row apply-audit reads.
ROW_FIELDS = ("key", "split", "example_id", "question", "golden_answers", "answer", "tier",
              "score", "confidence", "agreement", "rank")

LABEL_CONFIG = """<View>
  <Header value="$key (rank $rank, score $score)"/>
  <Text name="question" value="$question"/>
  <Header value="Gold answers" size="5"/>
  <Text name="gold" value="$gold_text"/>
  <Header value="Policy answer" size="5"/>
  <Text name="answer" value="$answer"/>
  <Header value="Evidence" size="5"/>
  <Text name="evidence" value="$evidence"/>
  <Choices name="tier" toName="question" choice="single" showInline="true">
    <Choice value="gold_likely_wrong"/>
    <Choice value="gold_possibly_wrong"/>
    <Choice value="policy_error"/>
  </Choices>
  <Choices name="decision" toName="question" choice="single" showInline="true" required="true">
    <Choice value="accept" hint="the gold is right: keep it"/>
    <Choice value="correct" hint="replace the gold by the corrected answers"/>
    <Choice value="skip" hint="undecided"/>
  </Choices>
  <TextArea name="corrected_answers" toName="question" placeholder="one answer a line"
            editable="true"/>
  <TextArea name="reason" toName="question" placeholder="why" editable="true" maxSubmissions="1"/>
</View>
"""


class LabelStudioExportError(ValueError):
    """A Label Studio export apply-audit cannot read; names the file, task and field."""


def _evidence(row: Mapping[str, Any]) -> str:
    parts = [f"{who} in {row.get(f'{who}_doc')}: {row[f'{who}_snippet']}"
             for who in ("answer", "gold") if row.get(f"{who}_snippet")]
    return "\n".join(parts) or "(no passage holds the answer or the gold)"


def to_tasks(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Audit rows as Label Studio tasks with the tier as a pre-annotation."""
    tasks = []
    for row in rows:
        data = {k: row.get(k) for k in ROW_FIELDS}
        data |= {"gold_text": " | ".join(str(g) for g in row.get("golden_answers") or []),
                 "evidence": _evidence(row), "answer": str(row.get("answer") or "")}
        tasks.append({"data": data, "predictions": [{
            "model_version": MODEL_VERSION, "score": float(row.get("score") or 0.0),
            "result": [{"from_name": "tier", "to_name": "question", "type": "choices",
                        "value": {"choices": [str(row.get("tier"))]}}]}]})
    return tasks


def write_label_studio(suspects_path: Path, rows: list[dict[str, Any]]) -> Path:
    """`<suspects file stem>.label_studio.json` and the labeling config beside it."""
    out = suspects_path.with_name(suspects_path.stem + TASKS_SUFFIX)
    atomic_write_text(out, json.dumps(to_tasks(rows), indent=1, ensure_ascii=False,
                                      default=str))
    atomic_write_text(suspects_path.with_name(CONFIG_FILE), LABEL_CONFIG)
    return out


def is_label_studio_export(path: Path) -> bool:
    """A JSON array (Label Studio's export), not JSONL rows."""
    with path.open("rb") as fh:  # bytes: a file that is not UTF-8 is its reader's to refuse
        head = fh.read(4096).lstrip()
    return head.startswith(b"[")


def _steward(annotation: Mapping[str, Any]) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        return str(who.get("email") or f"label-studio-user-{who.get('id')}")
    return f"label-studio-user-{who}" if who is not None else ""


def _values(result: list[dict[str, Any]], name: str, kind: str) -> list[str]:
    for item in result:
        if item.get("from_name") == name:
            return [str(v) for v in (item.get("value") or {}).get(kind) or []]
    return []


def _when(annotation: Mapping[str, Any]) -> str:
    return str(annotation.get("updated_at") or annotation.get("created_at") or "")


def _decision(result: list[dict[str, Any]]) -> tuple[str, tuple[str, ...]]:
    decision = _values(result, "decision", "choices")
    answers = [a.strip() for text in _values(result, "corrected_answers", "text")
               for a in text.splitlines() if a.strip()]
    return (decision[0] if decision else "",
            tuple(answers) if decision[:1] == ["correct"] else ())


def _decide(task: Mapping[str, Any]) -> dict[str, Any]:
    """The row's decision from its annotations: each steward's latest one that was not
    cancelled (a steward may revise their own); stewards who decided differently are a
    conflict, never settled by whoever saved last. Who and when go into the override."""
    latest: dict[str, dict[str, Any]] = {}
    for annotation in sorted(task.get("annotations") or [], key=_when):
        if not annotation.get("was_cancelled"):
            latest[_steward(annotation)] = annotation
    decided = {who: a for who, a in latest.items()
               if _decision(a.get("result") or [])[0] not in ("", "skip")}
    if not decided:
        return {}
    views = {who: _decision(a.get("result") or []) for who, a in decided.items()}
    if len(set(views.values())) > 1:
        said = "; ".join(f"{who} ({_when(decided[who])}): {d} {list(answers)}"
                         for who, (d, answers) in sorted(views.items()))
        return {"conflict": f"stewards disagree in Label Studio ({said}); agree on one "
                            "decision there (delete or change the other annotation), export "
                            "again and re-run apply-audit"}
    last = max(decided.values(), key=_when)
    result = last.get("result") or []
    return {"decision": views[_steward(last)][0],
            "corrected_answers": list(views[_steward(last)][1]),
            "reason": " ".join(_values(result, "reason", "text")).strip(),
            "steward": ", ".join(sorted(decided)), "decided_at": _when(last),
            "source": f"label-studio:project {last.get('project') or task.get('project')}"
                      f"/task {task.get('id')}"
                      f"/annotation {last.get('id')}"}


def _check_annotations(task: Mapping[str, Any], label: str) -> None:
    """LabelStudioExportError naming the task and field when its annotations do not have the
    shape of Label Studio's JSON export (a list of objects, each `result` a list of
    objects)."""
    annotations = task.get("annotations") or []
    if not isinstance(annotations, list):
        raise LabelStudioExportError(f"{label}: field 'annotations': expected a list, got "
                                     f"{type(annotations).__name__}")
    for i, annotation in enumerate(annotations):
        where = f"{label}: field 'annotations[{i}]"
        if not isinstance(annotation, dict):
            raise LabelStudioExportError(f"{where}': expected an object, got "
                                         f"{type(annotation).__name__}")
        result = annotation.get("result") or []
        if not isinstance(result, list) or not all(isinstance(r, dict) for r in result):
            raise LabelStudioExportError(f"{where}.result': expected a list of objects (Label "
                                         "Studio's JSON export)")
        for item in result:
            if not isinstance(item.get("value") or {}, dict):
                raise LabelStudioExportError(f"{where}.result': field 'value' must be an "
                                             "object")


def rows_from_export(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(label naming file and task, audit row with the steward's decision) per exported task;
    a task nobody annotated is an undecided row."""
    text = read_user_text(path, "Label Studio export", LabelStudioExportError)
    try:
        tasks = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LabelStudioExportError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(tasks, list):
        raise LabelStudioExportError(f"{path}: expected Label Studio's JSON export (a list "
                                     "of tasks); export the project as JSON, not JSON_MIN/CSV")
    out = []
    for n, task in enumerate(tasks, start=1):
        label = f"{path}: task {task.get('id', n) if isinstance(task, dict) else n}"
        if not isinstance(task, dict) or not isinstance(task.get("data"), dict):
            raise LabelStudioExportError(f"{label}: field 'data' is missing: export the "
                                         "project created from *.label_studio.json as JSON")
        _check_annotations(task, label)
        row = {k: task["data"].get(k) for k in ROW_FIELDS}
        row |= {"decision": "", "corrected_answers": [], "reason": "", "steward": ""}
        row |= _decide(task)
        out.append((label, row))
    return out
