"""One bad line never kills validation: a line that is not JSON is quarantined with its file,
line and parse error while the rest validates; a file unreadable as a whole is one line (no
traceback) from the CLI and from the task. Also: leakage is reported on train rows quarantined
for another reason, and answer variants across rows of one question are reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchrl.config import PipelineConfig
from searchrl.datasets.io import DataError, read_qa
from searchrl.validation.validate import ValidationResult, validate_gold_labels
from tests.contracts.conftest import ROOT


def _row(row_id: str, question: str, answers: list[str], doc: str, **extra: Any) -> str:
    return json.dumps({"id": row_id, "question": question, "golden_answers": answers,
                       "hops": 1, "type": "single", "supporting_doc_ids": [doc]} | extra)


CORPUS = [
    {"id": "p1", "contents": "The abbey of Morn was founded in the year 1412."},
    {"id": "p2", "contents": "Mount Zorb is 4,200 metres high; the old survey said 9 metres."},
    {"id": "p3", "contents": "Lake Vell lies in Quelland."},
    {"id": "p4", "contents": "Orin Tal was born in Brisk."},
    {"id": "p5", "contents": "The Guild of Brisk began in 1412, the year 1412 of the chronicle."},
]
TRUNCATED = '{"id": "k9", "question": "Who bu'  # a write cut short mid-line
TRAIN = [
    _row("a1", "When was the abbey of Morn founded?", ["1412"], "p1"),              # line 1
    _row("a2", "When was the abbey of Morn founded?", ["the year 1412"], "p1"),     # line 2
    _row("k1", "How tall is Mount Zorb?", ["9 metres"], "p2"),                      # line 3
    _row("k2", "Where is Lake Vell?", ["Quelland"], "p3", hops=9),                  # line 4
    _row("k3", "Where was Orin Tal born?", [], "p4"),                               # line 5
    TRUNCATED,                                                                       # line 6
    _row("v1", "When did the Guild of Brisk begin?", ["1412"], "p5"),               # line 7
    _row("v1", "when did the guild of brisk begin", ["the year 1412"], "p5"),       # line 8
    _row("ok", "Who was born in Brisk?", ["Orin Tal"], "p4"),                       # line 9
]
TEST = [
    _row("e1", "how tall is mount zorb", ["4,200 metres"], "p2"),
    _row("e2", "Where is Lake Vell?", ["Quelland"], "p3"),
    _row("e3", "Where was Orin Tal born?", ["Brisk"], "p4"),
]


def _world(tmp_path: Path, train: list[str] | None = None) -> dict[str, Any]:
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    (data / "train.jsonl").write_text("\n".join(train or TRAIN) + "\n")
    (data / "test.jsonl").write_text("\n".join(TEST) + "\n")
    return {
        "run": {"name": "bad-lines", "work_dir": str(tmp_path / "run")},
        "data": {"source": "files", "train_path": str(data / "train.jsonl"),
                 "test_path": str(data / "test.jsonl"),
                 "corpus_path": str(data / "corpus.jsonl")},
        "validate": {"max_quarantine_fraction": 1.0, "overrides_path": None,
                     "contracts_dir": str(ROOT / "data_contracts")},
    }


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> ValidationResult:
    tmp = tmp_path_factory.mktemp("bad-lines")
    return validate_gold_labels(PipelineConfig.model_validate(_world(tmp)), tmp / "out")


def _quarantine(result: ValidationResult) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.quarantine_path.read_text().splitlines()]


def _flags(result: ValidationResult) -> dict[tuple[str, int], set[str]]:
    assert result.audit_path is not None
    out: dict[tuple[str, int], set[str]] = {}
    for f in json.loads(result.audit_path.read_text())["flags"]:
        out.setdefault((f["split"], f["row"]), set()).add(f["check"])
    return out


def test_a_truncated_line_is_quarantined_and_the_rest_validates(result: ValidationResult
                                                                ) -> None:
    train_file = str(Path(result.out_dir).parent / "data" / "train.jsonl")
    (bad,) = [q for q in _quarantine(result) if q["row"] == 6]
    assert bad["file"] == train_file and bad["split"] == "train"
    assert bad["reason"].startswith(f"parse: {train_file}:6: not valid JSON: ")
    (parse,) = bad["reasons"]
    assert parse["evidence"]["line"] == 6 and parse["evidence"]["text"] == TRUNCATED
    assert parse["evidence"]["error"].startswith("not valid JSON: ") and parse["quarantines"]
    # Counts add up: every line read is either clean or quarantined.
    assert result.audit_path is not None
    counts = result.counts
    split = json.loads(result.audit_path.read_text())["split_counts"]["train"]
    assert counts["rows_in"] == len(TRAIN) + len(TEST) == counts["clean"] + counts["quarantined"]
    assert split["rows_in"] == len(TRAIN) == split["clean"] + split["quarantined"]
    assert result.check_counts["parse"] == 1
    clean = {ex.id for ex in read_qa(result.split_paths["train"])}
    assert clean == {"a1", "ok"}


def test_rows_keep_the_source_file_and_line_numbers(result: ValidationResult) -> None:
    # Lines after the bad one are named by their line in the steward's file, not the copy's.
    assert {q["row"] for q in _quarantine(result) if q["id"] == "v1"} == {7, 8}
    assert all(q["file"].endswith(("data/train.jsonl", "data/test.jsonl"))
               for q in _quarantine(result))


def test_leakage_is_reported_on_train_rows_quarantined_for_another_reason(
        result: ValidationResult) -> None:
    flags = _flags(result)
    assert {"conflicting_gold", "leakage_exact"} <= flags[("train", 3)]  # k1: gold conflicts
    assert {"contract", "leakage_exact"} <= flags[("train", 4)]  # k2: hops 9
    assert {"contract", "leakage_exact"} <= flags[("train", 5)]  # k3: no gold answer at all
    assert {q["id"] for q in _quarantine(result)} >= {"k1", "k2", "k3"}


def test_answer_forms_across_rows_of_one_question_are_variants(result: ValidationResult) -> None:
    flags = _flags(result)
    assert "answer_variant" in flags[("train", 1)] and "answer_variant" in flags[("train", 2)]
    # Also when the rows are quarantined for something else (the same id twice).
    assert {"duplicate_id", "answer_variant"} <= flags[("train", 7)]
    assert {"duplicate_id", "answer_variant"} <= flags[("train", 8)]
    # The sound first row is kept; its duplicate goes.
    assert "duplicate_question" in flags[("train", 2)] and ("train", 1) in flags


# --- a file unreadable as a whole: one line, no traceback


@pytest.mark.parametrize(("name", "content", "match"), [
    ("train.jsonl", "<html>\n<body>not data</body>\n", "not JSONL: none of its 2 lines"),
    ("train.parquet", "PAR1 but not parquet", "not a readable parquet file"),
    ("absent.jsonl", None, "file not found"),
])
def test_cli_names_an_unreadable_file_in_one_line(tmp_path: Path, name: str,
                                                  content: str | None, match: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from searchrl.__main__ import main

    world = _world(tmp_path)
    bad = tmp_path / "data" / name
    if content is not None:
        bad.write_text(content)
    world["data"]["train_path"] = str(bad)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(world))
    capsys.readouterr()
    assert main(["validate", "--config", str(config)]) == 4  # an input file unreadable
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(str(bad)) and match in err


def test_task_fails_with_the_one_line_message(tmp_path: Path) -> None:
    from tasks.validate import validate_gold_labels as task

    world = _world(tmp_path)
    bad = tmp_path / "data" / "train.jsonl"
    bad.write_text("\x00\x01 binary\n\x02\n")
    config = PipelineConfig.model_validate(world)
    with pytest.raises(DataError) as info:
        task.fn(config, None, None)
    assert str(info.value).startswith(f"{bad}: not JSONL") and "\n" not in str(info.value)
