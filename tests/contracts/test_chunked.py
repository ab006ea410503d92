"""Chunked validation finds exactly what whole-frame validation finds: the GX suite run chunk
by chunk (ids unique across chunks), the streamed corpus pass of the stage (same flags, same
rows, same errors for a duplicate id split across chunks and for a bad line), the filtered
answer scan, and the streamed copy (byte for byte what `write_jsonl` writes)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from searchrl.config import PipelineConfig, ValidateConfig
from searchrl.datasets.io import DataError, passage_line, read_raw_qa_rows, write_jsonl
from searchrl.datasets.sources import materialise_sources
from searchrl.text import normalize_answer
from searchrl.types import Passage
from searchrl.validation import answerability, corpus
from searchrl.validation.answerability import find_answers, find_answers_exhaustive
from searchrl.validation.suites import ContractError, SuiteRunner, rows_values
from searchrl.validation.validate import validate_gold_labels
from tests.contracts.conftest import DEFECTS, ROOT, make_defects_config

WIKI = ROOT / "data" / "wiki2_corpus6k" / "corpus.jsonl"

CORPUS_ROWS: list[dict[str, Any]] = [
    {"id": "a", "contents": "x"}, {"id": "b", "contents": "  "}, {"id": None, "contents": "y"},
    {"id": 5, "contents": "z" * 40, "title": 3}, {"id": "a", "contents": "ok"},
    {"id": "", "contents": None}, {"id": "c", "contents": "c"}, {"id": 5, "contents": "d"},
    {"id": "b", "title": "t", "contents": "e"}, {"id": None, "contents": "f"},
    {"id": 5.0, "contents": "g"}, {"id": "d", "contents": "h"},
]


@pytest.fixture(scope="module")
def runner() -> SuiteRunner:
    return SuiteRunner(ROOT / "data_contracts", ValidateConfig(
        overrides_path=None, max_passage_chars=30, eval_requires_hops=True))


@pytest.mark.parametrize("suite", [
    "corpus", pytest.param("gold_qa", marks=pytest.mark.slow)])  # gold_qa ~13 s: CI's slow step
def test_chunked_suite_equals_whole_frame(runner: SuiteRunner, suite: str) -> None:
    if suite == "corpus":
        rows = CORPUS_ROWS
    else:  # the defects world's train rows: duplicate ids, bad types, missing fields
        rows = [raw for _, raw in read_raw_qa_rows(DEFECTS / "train.jsonl")]
        rows = rows + rows[:3]  # every id of the first three again, chunks apart
    whole = runner.run(suite, "d", rows)
    assert any(c == "duplicate_id" for fails in whole.row_failures.values() for c, _ in fails)
    for size in (1, 2, 3, 5, len(rows)):
        run = runner.chunked(suite, "d")
        for start in range(0, len(rows), size):
            run.add(rows[start:start + size])
        got = run.finish(rows_values(rows, runner.modules[suite].to_frame))
        assert got.outcomes == whole.outcomes, size
        assert got.row_failures == whole.row_failures, size
        assert list(got.row_failures) == sorted(got.row_failures)


def _files_config(tmp_path: Path, passages: list[str], **data: Any) -> PipelineConfig:
    path = tmp_path / "corpus.jsonl"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in passages), encoding="utf-8")
    config = make_defects_config(tmp_path)
    return config.model_copy(update={"data": config.data.model_copy(
        update={"corpus_path": str(path), **data})})


def _validate(config: PipelineConfig, out: Path, chunk: int,
              monkeypatch: pytest.MonkeyPatch) -> Any:
    """validate_gold_labels with corpus chunks (and answer-filter steps) of `chunk` passages;
    what it wrote, or the error it raised."""
    monkeypatch.setattr(corpus, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(answerability, "_STEP", chunk)
    try:
        result = validate_gold_labels(config, out)
    except (ContractError, DataError) as exc:
        return type(exc).__name__, str(exc).replace(str(out), "<out>")
    audit = json.loads(result.audit_path.read_text())  # type: ignore[union-attr]
    copy = result.corpus_path.read_bytes()
    drift = {}  # the passages' drift hashes
    for path in sorted(result.digest_dir.glob("corpus_*.npz")):  # type: ignore[union-attr]
        with np.load(path) as digest:
            drift[path.name] = (digest["ids"].tolist(), digest["content"].tolist())
    assert drift
    return audit["flags"], audit["counts"], audit["suites"], copy, drift


def _with_workers(config: PipelineConfig, workers: int) -> PipelineConfig:
    """`workers` check processes, whatever the corpus's size (0: none)."""
    return config.model_copy(update={"engine": config.engine.model_copy(
        update={"local_workers": workers, "local_workers_min_corpus_mb": 0.0})})


def _checked_here(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the chunks this process checks itself (a spawned worker imports its own)."""
    calls: list[int] = []
    check = corpus._check_chunk

    def counted(*args: Any) -> Any:
        calls.append(1)
        return check(*args)

    monkeypatch.setattr(corpus, "_check_chunk", counted)
    return calls


def _defect_passages() -> list[str]:
    return (DEFECTS / "corpus.jsonl").read_text(encoding="utf-8").splitlines()


def test_stage_chunked_equals_whole_on_a_clean_corpus(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = _files_config(tmp_path, _defect_passages())
    whole = _validate(config, tmp_path / "whole", 10**6, monkeypatch)
    assert whole[0], "the defects world must raise answerability flags"
    assert {f["check"] for f in whole[0]} & {"unanswerable", "not_in_supporting"}
    for chunk in (1, 2, 3):
        assert _validate(config, tmp_path / f"c{chunk}", chunk, monkeypatch) == whole


def test_stage_on_worker_processes_equals_in_process(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker, chunks of 2 passages (two in flight, recorded in chunk order): the same
    flags, counts, suite outcomes and copy bytes as in-process (two workers: the slow case
    below, one worker process costs ~3 s of imports)."""
    config = _files_config(tmp_path, _defect_passages())
    here = _checked_here(monkeypatch)
    alone = _validate(_with_workers(config, 0), tmp_path / "alone", 2, monkeypatch)
    assert here and alone[0]
    here.clear()
    assert _validate(_with_workers(config, 1), tmp_path / "w1", 2, monkeypatch) == alone
    assert not here, "every chunk went to the workers"
    assert _with_workers(config, 3).fingerprint_of("validate_gold_labels") == \
        config.fingerprint_of("validate_gold_labels")


def test_a_corpus_below_the_threshold_starts_no_worker(tmp_path: Path) -> None:
    config = _files_config(tmp_path, _defect_passages())
    sources = materialise_sources(config.data, tmp_path / "source", copy_corpora=False)
    runner = SuiteRunner(ROOT / "data_contracts", config.validate_)
    assert config.engine.local_workers >= 1  # the default has workers, for large corpora
    size_mb = (tmp_path / "corpus.jsonl").stat().st_size / 2**20
    above = config.engine.model_copy(update={"local_workers_min_corpus_mb": size_mb * 1.01})
    for engine in (config.engine, above):
        with corpus.chunk_workers(engine, runner, sources) as workers:
            assert workers is None


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_stage_chunked_equals_whole_on_broken_corpora(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      workers: int) -> None:
    """Whole, in chunks, and in chunks on worker processes: the same errors, word for word."""
    lines = _defect_passages()
    first = json.loads(lines[0])
    dup = json.dumps({**first, "contents": "another passage with the first one's id"})
    blank = json.dumps({"id": "blank", "contents": "   "})
    for name, passages, error in (
            ("dup_split", [*lines, blank, dup], "ContractError"),
            ("bad_line", [*lines[:2], '{"id": "cut", "contents": "a write cu', *lines[2:]],
             "DataError"),
            ("bad_row_before_bad_line", [lines[0], '{"id": "x"}', "not json", *lines[1:]],
             "DataError")):
        config = _files_config(tmp_path / name, passages)
        whole = _validate(config, tmp_path / name / "whole", 10**6, monkeypatch)
        assert whole[0] == error, whole
        for chunk in (1, 3):
            assert _validate(_with_workers(config, workers), tmp_path / name / f"c{chunk}",
                             chunk, monkeypatch) == whole
    # what the whole-frame stage said before chunking, word for word
    dup_msg = _validate(_files_config(tmp_path / "dup_split", [*lines, blank, dup]),
                        tmp_path / "again", 2, monkeypatch)[1]
    n = len(lines)
    assert "source/corpus.jsonl: row 1: id: must be unique in the corpus" in dup_msg
    assert f"source/corpus.jsonl: row {n + 1}: contents: must not be blank" in dup_msg
    assert f"source/corpus.jsonl: row {n + 2}: id: must be unique in the corpus" in dup_msg


def _wiki(limit: int) -> list[Passage]:
    with WIKI.open(encoding="utf-8") as fh:
        return [Passage.model_validate(json.loads(line)) for _, line in zip(range(limit), fh,
                                                                           strict=False)]


def test_filtered_answer_scan_equals_normalising_every_passage() -> None:
    passages = [
        *_wiki(1500),
        Passage(id="odd1", title="A", contents="The U.S.A. and O'Neil: über-thing, the–the "
                                                "ΣΑΣ, \u212aelvin, İstanbul."),
        Passage(id="odd2", contents="a separator \x00 inside the U.S. text"),
        Passage(id="odd3", title="The title", contents="The title leads; 1919."),
    ]
    answers = {normalize_answer(p.title or "") for p in passages[:1500:7]}
    answers |= {normalize_answer(" ".join(p.contents.split()[3:5])) for p in passages[::11]}
    answers |= {"usa", "us", "oneil", "überthing", "σας", "kelvin", "i̇stanbul", "us text",
                "1919", "title leads", "nowhere at all", "x", "thethe"}
    expected = find_answers_exhaustive(answers, [("c", passages), ("d", passages[:10])])
    assert len(expected) > 100 and "nowhere at all" not in expected
    for chunk in (1, 50, 10_000):
        assert find_answers(answers, [("c", passages), ("d", passages[:10])],
                            chunk=chunk) == expected


def test_streamed_copy_line_is_write_jsonl_bytes(tmp_path: Path) -> None:
    passages = [*_wiki(200), Passage(id='q"\\1', title=None, contents="tab\there\nnl \x01 ü ☃"),
                Passage(id="t", title="", contents="x\u2028y")]
    write_jsonl(tmp_path / "w.jsonl", passages)
    assert "".join(passage_line(p) for p in passages).encode() == \
        (tmp_path / "w.jsonl").read_bytes()


@pytest.mark.slow
def test_a_suite_error_in_a_worker_surfaces_as_in_process(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite that raises (here: an expectation on a column the frame lacks) stops the stage
    with the same ContractError whether the chunk was checked here or in a worker."""
    contracts = tmp_path / "contracts"
    shutil.copytree(ROOT / "data_contracts", contracts)
    suite = contracts / "corpus.py"
    text = suite.read_text(encoding="utf-8")
    broken = text.replace('gxe.ExpectColumnValuesToMatchRegex(column="contents"',
                          'gxe.ExpectColumnValuesToMatchRegex(column="no_such_column"')
    assert broken != text
    suite.write_text(broken, encoding="utf-8")
    config = _files_config(tmp_path, _defect_passages())
    config = config.model_copy(update={"validate_": config.validate_.model_copy(
        update={"contracts_dir": contracts})})
    alone = _validate(_with_workers(config, 0), tmp_path / "alone", 3, monkeypatch)
    assert alone[0] == "ContractError" and "no_such_column" in alone[1], alone
    assert _validate(_with_workers(config, 2), tmp_path / "w2", 3, monkeypatch) == alone
