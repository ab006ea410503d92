from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchrl.datasets.io import (
    DIR_MANIFEST,
    DataError,
    fingerprint,
    manifest_path,
    read_manifest,
    read_passages,
    read_qa,
    read_raw_qa_rows,
    read_raw_qa_rows_lenient,
    write_jsonl,
)

ROWS = [
    {"id": "q1", "question": "Who?", "golden_answers": ["Ann", "Anne"], "hops": 1},
    {"id": 2, "question": "Where?", "answer": "Paris", "type": "bridge"},  # FlashRAG-ish
]


def _check(records: list) -> None:  # type: ignore[type-arg]
    assert [r.id for r in records] == ["q1", "2"]
    assert records[0].golden_answers == ("Ann", "Anne")
    assert records[1].golden_answers == ("Paris",)
    assert records[1].type == "bridge"


def test_reads_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    _check(read_qa(path))


def test_reads_json_list_and_data_key(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    (tmp_path / "b.json").write_text(json.dumps({"data": ROWS}))
    _check(read_qa(tmp_path / "a.json"))
    _check(read_qa(tmp_path / "b.json"))


def test_reads_parquet(tmp_path: Path) -> None:
    rows = [{"id": "q1", "question": "Who?", "golden_answers": ["Ann", "Anne"], "hops": 1,
             "type": None},
            {"id": "2", "question": "Where?", "golden_answers": ["Paris"], "hops": None,
             "type": "bridge"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "qa.parquet")
    _check(read_qa(tmp_path / "qa.parquet"))


def test_reads_datasets_directory(tmp_path: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_list([{"id": "q1", "question": "Who?",
                                      "golden_answers": ["Ann", "Anne"]},
                                     {"id": "2", "question": "Where?",
                                      "golden_answers": ["Paris"]}])
    ds.save_to_disk(str(tmp_path / "ds"))
    records = read_qa(tmp_path / "ds")
    assert [r.golden_answers for r in records] == [("Ann", "Anne"), ("Paris",)]


def test_passages_accept_search_r1_and_flashrag_layouts(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"id": "0", "contents": '"Paris"\nParis is a city.'}) + "\n"
                    + json.dumps({"id": 1, "text": "Plain text", "title": "T"}) + "\n")
    passages = read_passages(path)
    assert passages[0].title == "Paris"
    assert passages[1].id == "1" and passages[1].contents == "Plain text"


def test_missing_question_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps({"id": "x", "answer": "y"}) + "\n")
    with pytest.raises(DataError, match=r"qa\.jsonl: row 3: field 'question'"):
        read_qa(path)


def test_missing_gold_answer_and_bad_json_are_named(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": "x", "question": "q?", "golden_answers": []}) + "\n")
    with pytest.raises(DataError, match=r"row 1: field 'golden_answers'"):
        read_qa(path)
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"qa\.jsonl:2: not valid JSON"):
        read_qa(path)


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        read_qa(tmp_path / "nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported format"):
        read_qa(tmp_path / "x.csv")


def test_manifest_is_the_fingerprint_and_detects_edits(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sha = write_jsonl(path, read_qa_rows())
    manifest = read_manifest(path)
    assert manifest == {"file": "out.jsonl", "rows": 2, "sha256": sha}
    assert fingerprint(path) == sha
    path.write_text(path.read_text() + "\n")
    assert read_manifest(path) is None  # stale manifest is not trusted
    assert fingerprint(path) != sha


def test_torn_or_directory_manifests(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, read_qa_rows())
    manifest_path(path).write_text("{")  # torn: treated as absent, not an error
    assert read_manifest(path) is None
    index = tmp_path / "index"
    index.mkdir()
    assert read_manifest(index, directory=True) is None
    (index / DIR_MANIFEST).write_text(json.dumps({"complete": True}))
    assert read_manifest(index, directory=True) == {"complete": True}
    assert read_manifest(index) is None  # a file's manifest is never looked for inside it


def test_failed_write_leaves_no_manifest(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, read_qa_rows())

    with pytest.raises(TypeError):
        write_jsonl(path, [{"unserialisable": object()}])
    assert not manifest_path(path).exists()
    assert not list(tmp_path.glob(".*.tmp"))


def read_qa_rows() -> list[dict]:  # type: ignore[type-arg]
    return [{"id": "a", "question": "q?", "golden_answers": ["x"]},
            {"id": "b", "question": "r?", "golden_answers": ["y"]}]


def test_null_id_is_rejected_not_stringified(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"id": None, "question": "q?", "golden_answers": ["a"]}) + "\n")
    with pytest.raises(DataError, match=r"row 1: field 'id'"):
        read_qa(path)


def test_written_files_are_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, read_qa_rows())
    assert path.stat().st_mode & 0o044  # not the 0600 of a raw temp file


# --- lines that are not JSON objects: quarantined by validation, fatal everywhere else


def _with_bad_lines(path: Path) -> Path:
    good = json.dumps(ROWS[0])
    lines = [good, good[:25], "", "[1, 2]", good.replace("q1", "q5"), "caf\xe9"]
    path.write_bytes("\n".join(lines[:5]).encode() + b"\n" + lines[5].encode("latin-1") + b"\n")
    return path


def test_lenient_reader_hands_back_bad_lines_with_file_line_and_error(tmp_path: Path) -> None:
    path = _with_bad_lines(tmp_path / "qa.jsonl")
    rows, bad = read_raw_qa_rows_lenient(path)
    assert [rowno for rowno, _ in rows] == [1, 5]  # source line numbers; line 3 is blank
    assert [b.line for b in bad] == [2, 4, 6]
    assert all(b.source == str(path) for b in bad)
    assert bad[0].error.startswith("not valid JSON: ")
    assert bad[0].text == json.dumps(ROWS[0])[:25]  # the line as read, for the steward
    assert bad[1].error == "expected a JSON object"
    assert bad[2].error.startswith("not valid UTF-8")
    assert bad[0].message == f"{path}:2: {bad[0].error}"


def test_strict_readers_still_fail_on_the_first_bad_line(tmp_path: Path) -> None:
    path = _with_bad_lines(tmp_path / "qa.jsonl")
    for reader in (read_qa, read_raw_qa_rows):
        with pytest.raises(DataError, match=r"qa\.jsonl:2: not valid JSON: "):
            reader(path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Paris."}\n{"id": "p2", "cont\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl:2: not valid JSON: "):
        read_passages(corpus)


@pytest.mark.parametrize(("name", "content", "match"), [
    ("garbage.jsonl", b"<html>\n<body>oops</body>\n", r"garbage\.jsonl: not JSONL: none of "
                                                          r"its 2 lines is a JSON object"),
    ("bad.parquet", b"PAR1 not really", r"bad\.parquet: not a readable parquet file"),
    ("missing.jsonl", None, r"missing\.jsonl: file not found"),
])
def test_a_wholly_unreadable_file_is_one_line_naming_it(tmp_path: Path, name: str,
                                                         content: bytes | None,
                                                         match: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=match) as info:
        read_raw_qa_rows_lenient(path)
    assert "\n" not in str(info.value)


def test_fingerprints_read_a_file_once_while_it_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from searchrl.datasets import io

    reads: list[Path] = []
    real = io.content_sha256
    monkeypatch.setattr(io, "content_sha256", lambda p: reads.append(p) or real(p))
    io._sha256_for_stat.cache_clear()
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "weights.bin").write_bytes(b"a" * 1000)
    (policy / "config.json").write_text("{}")
    first = fingerprint(policy)
    assert [fingerprint(policy) for _ in range(3)] == [first] * 3
    assert len(reads) == 2  # each file read once, not four times
    # A rewrite of the same size is seen: atomically replaced (new inode) ...
    tmp = policy / "weights.tmp"
    tmp.write_bytes(b"b" * 1000)
    os.replace(tmp, policy / "weights.bin")
    second = fingerprint(policy)
    assert second != first
    # ... or written in place (new modification time).
    stat = (policy / "weights.bin").stat()
    (policy / "weights.bin").write_bytes(b"c" * 1000)
    os.utime(policy / "weights.bin", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert fingerprint(policy) not in (first, second)


# --- gold answers of other types (one rule: datasets.io.answer_strings, prepare uses it too)


@pytest.mark.parametrize(("value", "expected"), [
    ("Paris", ["Paris"]),
    (1412, ["1412"]),
    (1412.0, ["1412"]),  # a parquet float column: the year, not "1412.0"
    (3.5, ["3.5"]),
    (["Ann", 7], ["Ann", "7"]),
    ({"text": ["Denver Broncos", "Broncos"], "answer_start": [177, 181]},  # SQuAD (HF)
     ["Denver Broncos", "Broncos"]),
    ([{"text": "Denver Broncos", "answer_start": 177}], ["Denver Broncos"]),  # SQuAD (raw)
    (None, []),
])
def test_answer_strings_reads_numbers_and_squad(value: object, expected: list[str]) -> None:
    from searchrl.datasets.io import answer_strings

    assert answer_strings(value) == expected


@pytest.mark.parametrize(("value", "says"), [
    (True, "boolean"),
    ({"value": "Paris"}, "dict with keys ['value']"),
    ([["Paris"]], "list inside the list"),
    (["Paris", None], "null"),
    (float("nan"), "not a finite number"),
])
def test_answer_strings_rejects_other_types_saying_what_they_are(value: object,
                                                                 says: str) -> None:
    from searchrl.datasets.io import AnswerTypeError, answer_strings

    with pytest.raises(AnswerTypeError, match=re.escape(says)):
        answer_strings(value)


def test_readers_normalise_numeric_and_squad_answers(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    rows = [{"id": "a", "question": "When?", "answer": 1412},
            {"id": "b", "question": "Who?",
             "answers": {"text": ["Denver Broncos"], "answer_start": [177]}},
            {"id": "c", "question": "What?", "answer": {"value": "x"}},
            {"id": "d", "question": "Which?", "answer": True}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw, bad = read_raw_qa_rows_lenient(path)  # raised TypeError on row a before
    assert not bad
    golds = [r["golden_answers"] for _, r in raw]
    # c and d are left as read: the gold_qa contract quarantines them (golden_answers field)
    assert golds == [["1412"], ["Denver Broncos"], {"value": "x"}, True]
    with pytest.raises(DataError, match=r"qa\.jsonl: row 3: field 'golden_answers'"):
        read_qa(path)
    assert [ex.golden_answers for ex in read_qa(_lines(tmp_path / "ok.jsonl", rows[:2]))] == \
        [("1412",), ("Denver Broncos",)]


def _lines(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
