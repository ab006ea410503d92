"""Materialising the configured sources: a corpus file several names share is copied once."""

from __future__ import annotations

from pathlib import Path

from searchrl.config import DataConfig
from searchrl.datasets.io import read_passages, write_jsonl
from searchrl.datasets.sources import materialise_sources


def test_a_corpus_file_shared_by_names_is_copied_once(tmp_path: Path) -> None:
    main, other = tmp_path / "corpus.jsonl", tmp_path / "other.jsonl"
    write_jsonl(main, [{"id": "d1", "contents": "Vormak is a city."}])
    write_jsonl(other, [{"id": "o1", "contents": "Quorn is a moon."}])
    qa = tmp_path / "qa.jsonl"
    write_jsonl(qa, [{"id": "q1", "question": "Where?", "golden_answers": ["Vormak"]}])
    cfg = DataConfig(source="files", train_path=str(qa), test_path=str(qa),
                     corpus_path=str(main),
                     extra_eval={"a": str(qa), "b": str(qa), "c": str(qa)},
                     extra_corpus={"a": str(main), "b": str(other), "c": str(other)})
    out = tmp_path / "source"
    paths = materialise_sources(cfg, out)
    corpora = paths.extra_corpora
    assert corpora["a"] == paths.corpus  # prepare-data's layout: the main corpus
    assert corpora["b"] == corpora["c"] == out / "extra_corpus_b.jsonl"
    assert sorted(p.name for p in out.glob("*corpus*.jsonl")) == ["corpus.jsonl",
                                                                "extra_corpus_b.jsonl"]
    assert [p.id for p in read_passages(corpora["c"])] == ["o1"]
    assert set(paths.splits) == {"train", "test"}
    assert paths.extra_evals == {n: out / f"extra_eval_{n}.jsonl" for n in "abc"}
