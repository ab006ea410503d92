"""Gold answers of other types through validation: a number is its text, SQuAD's
{"text", "answer_start"} its texts, anything else is quarantined with its file, line and
field (never a TypeError that stops the stage, never dict keys taken as answers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.datasets.io import read_qa
from searchrl.validation.validate import validate_gold_labels
from tests.contracts.test_bad_lines import _world


def _plain(row_id: str, question: str, doc: str, **answer: Any) -> str:
    return json.dumps({"id": row_id, "question": question, "hops": 1, "type": "single",
                       "supporting_doc_ids": [doc], **answer})


TRAIN = [
    _plain("n1", "When was the abbey of Morn founded?", "p1", answer=1412),            # 1
    _plain("s1", "Which country holds the lake named Vell?", "p3",
           answers={"text": ["Quelland"], "answer_start": [14]}),                     # 2
    _plain("d1", "What town saw the birth of Orin Tal?", "p4", answer={"value": "Brisk"}),  # 3
    _plain("b1", "Is Mount Zorb high?", "p2", answer=True),                            # 4
    _plain("l1", "Who was born in Brisk?", "p4", golden_answers=[["Orin Tal"]]),       # 5
]


def test_numbers_and_squad_answers_are_clean_other_types_quarantined(tmp_path: Path) -> None:
    world = _world(tmp_path, TRAIN)
    result = validate_gold_labels(PipelineConfig.model_validate(world), tmp_path / "out")
    clean = {ex.id: ex.golden_answers for ex in read_qa(result.split_paths["train"])}
    assert clean == {"n1": ("1412",), "s1": ("Quelland",)}
    quarantined = {q["row"]: q for q in map(json.loads,
                                            result.quarantine_path.read_text().splitlines())}
    assert set(quarantined) == {3, 4, 5}
    train_file = world["data"]["train_path"]
    for q in quarantined.values():
        assert q["file"] == train_file and q["split"] == "train"
        assert q["reason"] == "contract: golden_answers: must be a list of strings"
