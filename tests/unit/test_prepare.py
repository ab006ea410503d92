"""prepare_data: real Search-R1 / FlashRAG / raw benchmark layouts -> the pipeline's inputs."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchrl.config import DataConfig, PipelineConfig
from searchrl.datasets.io import DataError, read_manifest, read_passages, read_qa
from searchrl.datasets.prepare import PrepareSpec, load_spec, prepare_data

REPO = Path(__file__).resolve().parents[2]
HOTPOT = REPO / "data" / "hotpotqa_train100"


def _jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def _spec(**kw: Any) -> PrepareSpec:
    return PrepareSpec.model_validate(kw)


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "prepared.json").read_text())
    return report


# --- (1) the bundled HotpotQA sample


def test_bundled_hotpotqa_sample(tmp_path: Path) -> None:
    questions, corpus = str(HOTPOT / "questions.jsonl"), str(HOTPOT / "corpus.jsonl")
    spec = _spec(train=[{"name": "hotpotqa", "source": questions}],
                 eval={"hotpotqa": {"source": questions, "max_rows": 40},
                       "hotpotqa_all": {"source": questions}},
                 corpus={"source": corpus})
    out = tmp_path / "prepared"
    result = prepare_data(spec, out, progress=False)

    n_questions = sum(1 for _ in (HOTPOT / "questions.jsonl").open())
    n_passages = sum(1 for _ in (HOTPOT / "corpus.jsonl").open())
    assert result.counts == {"train": n_questions, "corpus": n_passages,
                             "eval:hotpotqa": 40, "eval:hotpotqa_all": n_questions}
    train = read_qa(result.train_path)
    assert len(train) == n_questions and not result.skipped
    assert {ex.hops for ex in train} == {2} and {ex.type for ex in train} <= {"bridge",
                                                                              "comparison"}
    passages = read_passages(result.corpus_path)
    assert len(passages) == n_passages and all(p.title for p in passages)
    # The sample's supporting ids all resolve in its corpus, so they are kept.
    ids = {p.id for p in passages}
    assert all(ex.supporting_doc_ids and set(ex.supporting_doc_ids) <= ids for ex in train)
    assert len(read_qa(result.eval_paths["hotpotqa"])) == 40
    for path in (result.train_path, result.corpus_path, *result.eval_paths.values()):
        assert read_manifest(path) is not None

    fragment = yaml.safe_load(result.data_yaml.read_text())
    cfg = DataConfig.model_validate(fragment["data"])
    assert cfg.source == "files" and cfg.test_path == str(result.eval_paths["hotpotqa"])
    assert cfg.extra_eval == {"hotpotqa_all": str(result.eval_paths["hotpotqa_all"])}
    assert cfg.extra_corpus == {"hotpotqa_all": str(result.corpus_path)}
    # `--config tiny.yaml` with this data section is a valid pipeline config.
    tiny = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text())
    PipelineConfig.model_validate({**tiny, "data": fragment["data"]})

    report = _report(out)
    assert report["layouts"] == {"hotpotqa": "flashrag", "eval:hotpotqa": "flashrag",
                                 "eval:hotpotqa_all": "flashrag"}
    part = report["train"]["parts"]["hotpotqa"]
    assert part["rows_read"] == part["clean"] == part["kept"] == n_questions


# --- (2) raw layouts, detected


NQ = [{"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]},
      {"question": "capital of france", "answer": ["Paris"]}]
HOTPOT_HF = {  # the HF `datasets` form: dicts of lists
    "_id": "h1", "question": "Which magazine started first?", "answer": "Arthur's Magazine",
    "type": "comparison", "level": "medium",
    "supporting_facts": {"title": ["Arthur's Magazine", "First for Women"], "sent_id": [0, 0]},
    "context": {"title": ["First for Women", "Arthur's Magazine", "Noise"],
                "sentences": [["First for Women is a magazine.", " Started 1989."],
                              ["Arthur's Magazine was a periodical.", " Started 1844."],
                              ["Unrelated text."]]}}
TWOWIKI = [
    {"_id": "w1", "question": "Who is the director of film Alpha?", "answer": "Jane Doe",
     "type": "compositional", "evidences": [],
     "supporting_facts": [["Alpha (film)", 0], ["Jane Doe", 1]],
     "context": [["Jane Doe", ["Jane Doe is a director.", "She was born in 1950."]],
                 ["Alpha (film)", ["Alpha is a film directed by Jane Doe."]],
                 ["Beta", ["Beta is a film."]]]},
    {"_id": "w2", "question": "Which film has the director born later, Alpha or Gamma?",
     "answer": "Gamma", "type": "bridge_comparison", "evidences": [],
     "supporting_facts": [["Alpha (film)", 0], ["Jane Doe", 1], ["Gamma", 0], ["Tom Roe", 0]],
     "context": [["Alpha (film)", ["Alpha is a film directed by Jane Doe."]],
                 ["Jane Doe", ["Jane Doe is a director.", "She was born in 1950."]],
                 ["Gamma", ["Gamma is a film directed by Tom Roe."]],
                 ["Tom Roe", ["Tom Roe was born in 1970."]]]}]


def _musique(rid: str, decomposition_idx: list[int], supporting: set[int]) -> dict[str, Any]:
    return {"id": rid, "question": f"question {rid}?", "answer": "Oslo",
            "answer_aliases": ["Kristiania", "Oslo"], "answerable": True,
            "paragraphs": [{"idx": i, "title": f"T{i}", "paragraph_text": f"text {rid} {i}",
                            "is_supporting": i in supporting} for i in range(5)],
            "question_decomposition": [{"id": k, "question": "q", "answer": "a",
                                        "paragraph_support_idx": i}
                                       for k, i in enumerate(decomposition_idx)]}


def test_raw_layouts_detected(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    s1 = tmp_path / "nq_hotpotqa_train.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"id": "train_0", "question": "who sang x", "golden_answers": ["Ann", "Anne"],
         "data_source": "nq"},
        {"id": "train_0", "question": "which is older, a or b", "golden_answers": ["a"],
         "data_source": "hotpotqa"}]), s1)
    musique = _jsonl(tmp_path / "musique.jsonl", [
        _musique("2hop__1_2", [3, 1], {1, 3}), _musique("3hop1__4_5_6", [4, 0, 2], {0, 2, 4})])
    twowiki = tmp_path / "2wiki.json"
    twowiki.write_text(json.dumps(TWOWIKI))
    spec = _spec(
        train=[{"name": "nq", "source": _jsonl(tmp_path / "nq.jsonl", NQ)},
               {"name": "s1", "source": str(s1)},
               {"name": "hotpotqa", "source": _jsonl(tmp_path / "hp.jsonl", [HOTPOT_HF])}],
        eval={"musique": {"source": musique}, "2wiki": {"source": str(twowiki)},
              "triviaqa": {"source": _jsonl(tmp_path / "tqa.jsonl", [
                  {"question_id": "tq1", "question": "city of light?",
                   "answer": {"value": "Paris", "aliases": ["Paris", "Paree"]}}])},
              "popqa": {"source": _jsonl(tmp_path / "popqa.jsonl", [
                  {"id": 7, "question": "occupation of X?",
                   "possible_answers": '["actor", "actress"]'}])},
              "bamboogle": {"source": _jsonl(tmp_path / "bamboogle.jsonl", [
                  {"id": "b1", "question": "q?", "golden_answers": ["x"],
                   "metadata": {}}])}},
        corpus={"from_questions": True}, primary_eval="musique")
    out = tmp_path / "out"
    result = prepare_data(spec, out, progress=False)

    assert result.layouts == {"nq": "nq_open", "s1": "search_r1", "hotpotqa": "hotpotqa",
                              "eval:musique": "musique", "eval:2wiki": "2wiki",
                              "eval:triviaqa": "triviaqa", "eval:popqa": "popqa",
                              "eval:bamboogle": "flashrag"}
    passages = {p.id: p for p in read_passages(result.corpus_path)}
    # Supporting ids point at the row's own paragraphs, in chain order.
    mus = {ex.id: ex for ex in read_qa(result.eval_paths["musique"])}
    assert (mus["2hop__1_2"].hops, mus["2hop__1_2"].type) == (2, "2hop")
    assert (mus["3hop1__4_5_6"].hops, mus["3hop1__4_5_6"].type) == (3, "3hop")
    assert mus["2hop__1_2"].golden_answers == ("Oslo", "Kristiania")
    assert [passages[d].title for d in mus["2hop__1_2"].supporting_doc_ids] == ["T3", "T1"]
    assert [passages[d].title for d in mus["3hop1__4_5_6"].supporting_doc_ids] == \
        ["T4", "T0", "T2"]
    wiki = {ex.id: ex for ex in read_qa(result.eval_paths["2wiki"])}
    assert (wiki["w1"].hops, wiki["w1"].type) == (2, "compositional")
    assert wiki["w2"].hops == 4  # bridge_comparison: four pages
    assert [passages[d].title for d in wiki["w1"].supporting_doc_ids] == \
        ["Alpha (film)", "Jane Doe"]
    # Identical paragraphs shared by two questions are one passage.
    assert set(wiki["w1"].supporting_doc_ids) < set(wiki["w2"].supporting_doc_ids)
    assert passages[wiki["w1"].supporting_doc_ids[1]].contents.startswith('"Jane Doe"\n')
    (tqa,) = read_qa(result.eval_paths["triviaqa"])
    assert (tqa.id, tqa.golden_answers, tqa.hops) == ("tq1", ("Paris", "Paree"), 1)
    (pop,) = read_qa(result.eval_paths["popqa"])
    assert (pop.id, pop.golden_answers, pop.hops) == ("7", ("actor", "actress"), 1)
    (bam,) = read_qa(result.eval_paths["bamboogle"])
    assert (bam.hops, bam.supporting_doc_ids) == (2, ())

    train_rows = [json.loads(line) for line in result.train_path.read_text().splitlines()]
    by_id = {r["id"]: r for r in train_rows}
    # Both Search-R1 rows are "train_0" (nq and hotpotqa): ids get their data source.
    assert set(by_id) == {"nq:nq-1", "nq:nq-2", "nq:train_0", "hotpotqa:train_0",
                          "hotpotqa:h1"}
    assert (by_id["nq:train_0"]["hops"], by_id["hotpotqa:train_0"]["hops"]) == (1, 2)
    assert by_id["nq:train_0"]["golden_answers"] == ["Ann", "Anne"]
    assert by_id["nq:nq-1"]["golden_answers"] == ["William Shakespeare", "Shakespeare"]
    assert all(by_id[i]["hops"] == 1 and not by_id[i]["supporting_doc_ids"]
               for i in ("nq:nq-1", "nq:nq-2"))
    hp = by_id["hotpotqa:h1"]
    assert (hp["hops"], hp["type"], hp["source_id"]) == (2, "comparison", "h1")
    assert [passages[d].title for d in hp["supporting_doc_ids"]] == \
        ["Arthur's Magazine", "First for Women"]
    cfg = DataConfig.model_validate(yaml.safe_load(result.data_yaml.read_text())["data"])
    assert cfg.test_path == str(result.eval_paths["musique"])
    assert set(cfg.extra_eval) == {"2wiki", "triviaqa", "popqa", "bamboogle"}


def test_train_mix_caps_and_seed(tmp_path: Path) -> None:
    a = _jsonl(tmp_path / "a.jsonl", [{"id": f"a{i}", "question": f"qa {i}",
                                       "golden_answers": ["x"]} for i in range(50)])
    b = _jsonl(tmp_path / "b.jsonl", [{"id": f"b{i}", "question": f"qb {i}",
                                       "golden_answers": ["y"]} for i in range(50)])
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "1", "contents": "text"}])

    def run(seed: int, out: str) -> list[str]:
        spec = _spec(train=[{"name": "a", "source": a, "max_rows": 10},
                            {"name": "b", "source": b, "max_rows": 5}],
                     eval={"a": {"source": a}}, corpus={"source": corpus}, seed=seed)
        res = prepare_data(spec, tmp_path / out, progress=False)
        return [ex.id for ex in read_qa(res.train_path)]

    first, again, other = run(1, "o1"), run(1, "o2"), run(2, "o3")
    assert first == again != other
    assert sum(i.startswith("a") for i in first) == 10 and len(first) == 15
    report = _report(tmp_path / "o1")["train"]["parts"]
    assert (report["a"]["clean"], report["a"]["kept"], report["b"]["kept"]) == (50, 10, 5)


# --- (3) bad rows are recorded, not dropped


def test_bad_rows_recorded_with_line_and_field(tmp_path: Path) -> None:
    qa = _jsonl(tmp_path / "nq.jsonl", [
        {"question": "ok one", "answer": ["A"]},
        {"question": "no answer"},
        {"question": "ok two", "answer": ["B"]},
        {"question": "   ", "answer": ["C"]},
        {"question": "blank answers", "answer": ["", " "]},
        {"question": "ok three", "answer": "D"}])
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "1", "contents": "text"}])
    spec = _spec(train=[{"name": "nq", "source": qa, "layout": "nq_open"}],
                 eval={"nq": {"source": qa}}, corpus={"source": corpus})
    result = prepare_data(spec, tmp_path / "out", progress=False)

    train_skips = [(s.line, s.field) for s in result.skipped if s.part == "nq"]
    assert train_skips == [(2, "answer"), (4, "question"), (5, "answer")] * 2
    assert all(s.file == qa for s in result.skipped)
    assert sorted(ex.question for ex in read_qa(result.train_path)) == ["ok one", "ok three",
                                                                       "ok two"]
    report = _report(tmp_path / "out")
    part = report["train"]["parts"]["nq"]
    assert part["clean"] + part["skipped"] == part["rows_read"] == 6
    assert {(s["line"], s["field"]) for s in report["skipped"]} == {(2, "answer"),
                                                                    (4, "question"),
                                                                    (5, "answer")}


def test_unreadable_sources_name_the_file(tmp_path: Path) -> None:
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "1", "contents": "text"}])
    good = _jsonl(tmp_path / "ok.jsonl", NQ)
    cases = {
        "missing.jsonl": None,
        "broken.jsonl": '{"question": "x", "answer": ["y"]}\n{not json\n',
        "allbad.jsonl": '{"question": "x"}\n{"question": "y"}\n',
        "unknown.jsonl": '{"foo": 1}\n',
    }
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        spec = _spec(train=[{"name": "t", "source": good}], eval={"e": {"source": str(path)}},
                     corpus={"source": corpus})
        with pytest.raises(DataError, match=name):
            prepare_data(spec, tmp_path / "out", progress=False)
        assert not (tmp_path / "out" / "prepared.json").exists()


# --- (4) the corpus stream


def test_corpus_wiki18_titles_duplicates_and_bad_rows(tmp_path: Path) -> None:
    qa = _jsonl(tmp_path / "qa.jsonl", [{"id": "q1", "question": "q?", "golden_answers": ["a"],
                                         "supporting_doc_ids": ["1", "2"]},
                                        {"id": "q2", "question": "r?", "golden_answers": ["b"],
                                         "supporting_doc_ids": ["1", "404"]}])
    corpus = _jsonl(tmp_path / "wiki-18.jsonl", [
        {"id": "1", "contents": '"Oslo"\nOslo is the capital of Norway.'},
        {"id": 2, "contents": '"Bergen"\nBergen is a city.'},
        {"id": "3", "contents": "no title line here"},
        {"id": "1", "contents": '"Oslo"\nA duplicate.'}])
    spec = _spec(train=[{"name": "t", "source": qa}], eval={"e": {"source": qa}},
                 corpus={"source": corpus})
    result = prepare_data(spec, tmp_path / "out", progress=False)
    passages = read_passages(result.corpus_path)
    assert [(p.id, p.title) for p in passages] == [("1", "Oslo"), ("2", "Bergen"), ("3", None),
                                                   ("1", "Oslo")]
    report = _report(tmp_path / "out")
    assert result.duplicate_corpus_ids == report["corpus"]["duplicate_ids"] == 1
    assert report["corpus"]["duplicate_examples"] == [{"id": "1", "lines": [1, 4]}]
    # q1's supporting ids resolve; q2's do not ("404"), so its are dropped and counted.
    sup = {ex.id: ex.supporting_doc_ids for ex in read_qa(result.train_path)}
    assert sup == {"q1": ("1", "2"), "q2": ()}
    assert report["supporting_doc_ids"]["dropped_not_in_corpus"] == 2  # train + eval copy

    bad = _jsonl(tmp_path / "bad.jsonl", [{"id": "1", "contents": "fine"}, {"id": "2"}])
    spec = _spec(train=[{"name": "t", "source": qa}], eval={"e": {"source": qa}},
                 corpus={"source": bad, "layout": "flashrag"})
    with pytest.raises(DataError, match=r"bad\.jsonl:2: field 'contents'"):
        prepare_data(spec, tmp_path / "out2", progress=False)


def test_corpus_streams_in_bounded_memory(tmp_path: Path) -> None:
    """A ~50 MB corpus is prepared with a traced peak far below its size (streamed)."""
    corpus = tmp_path / "wiki.jsonl"
    body = "lorem ipsum dolor sit amet " * 22
    with corpus.open("w") as fh:
        for i in range(80_000):
            fh.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\n{body}{i}'}) + "\n")
    size = corpus.stat().st_size
    assert size > 45e6
    qa = _jsonl(tmp_path / "qa.jsonl", NQ)
    spec = _spec(train=[{"name": "nq", "source": qa}], eval={"nq": {"source": qa}},
                 corpus={"source": str(corpus)})
    tracemalloc.start()
    try:
        result = prepare_data(spec, tmp_path / "out", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.counts["corpus"] == 80_000
    assert peak < 10e6, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB corpus"


# --- (5) nothing partial is marked complete


def test_failed_corpus_leaves_nothing_marked_complete(tmp_path: Path) -> None:
    qa = _jsonl(tmp_path / "qa.jsonl", NQ)
    good = _jsonl(tmp_path / "good.jsonl", [{"id": str(i), "contents": f"t {i}"}
                                            for i in range(100)])
    out = tmp_path / "out"
    spec = _spec(train=[{"name": "nq", "source": qa}], eval={"nq": {"source": qa}},
                 corpus={"source": good})
    prepare_data(spec, out, progress=False)
    assert (out / "prepared.json").exists()

    rows: list[Any] = [{"id": str(i), "contents": f"t {i}"} for i in range(100)]
    rows[60] = {"id": "60", "contents": ""}
    bad = _jsonl(tmp_path / "bad.jsonl", rows)
    spec = _spec(train=[{"name": "nq", "source": qa}], eval={"nq": {"source": qa}},
                 corpus={"source": bad})
    with pytest.raises(DataError, match=r"bad\.jsonl:61"):
        prepare_data(spec, out, progress=False)
    assert not (out / "prepared.json").exists()
    assert not (out / "data.yaml").exists()
    assert read_manifest(out / "corpus.jsonl") is None
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp leftovers


# --- the spec file


def test_load_spec_yaml(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "train": [{"name": "nq", "source": "nq.jsonl", "layout": "nq_open", "max_rows": 100},
                  {"name": "hotpotqa", "source": "hotpot.parquet"}],
        "eval": {"nq": {"source": "nq_test.jsonl"}, "musique": {"source": "m.jsonl"}},
        "corpus": {"source": "wiki-18.jsonl"}, "seed": 3}, sort_keys=False))
    spec = load_spec(path)
    assert spec.primary == "nq" and spec.train[0].max_rows == 100
    path.write_text(yaml.safe_dump({"train": [{"name": "nq", "source": "x", "layout": "nqopen"}],
                                    "eval": {"nq": {"source": "y"}},
                                    "corpus": {"from_questions": True, "source": "z"}}))
    with pytest.raises(DataError, match=r"spec\.yaml: invalid prepare spec.*train\.0\.layout"):
        load_spec(path)


def test_the_shipped_search_r1_spec_loads() -> None:
    spec = load_spec("configs/data/search_r1.yaml")
    assert spec.primary == "nq" and len(spec.eval) == 7


def test_answers_of_other_types_converted_or_skipped_with_line_and_field(tmp_path: Path
                                                                         ) -> None:
    qa = _jsonl(tmp_path / "nq.jsonl", [
        {"question": "year one", "answer": 1412},
        {"question": "squad one", "answers": {"text": ["Denver Broncos", "Broncos"],
                                              "answer_start": [177, 181]}},
        {"question": "dict one", "answer": "x", "answers": {"value": "y"}},
        {"question": "bool one", "answer": True},
        {"question": "ok", "answer": ["A", 2.0]}])
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "1", "contents": "text"}])
    spec = _spec(train=[{"name": "nq", "source": qa, "layout": "nq_open"}],
                 eval={"nq": {"source": qa}}, corpus={"source": corpus})
    result = prepare_data(spec, tmp_path / "out", progress=False)

    golds = {ex.question: ex.golden_answers for ex in read_qa(result.train_path)}
    assert golds == {"year one": ("1412",), "squad one": ("Denver Broncos", "Broncos"),
                     "ok": ("A", "2")}
    skips = {(s.line, s.field): s.reason for s in result.skipped if s.part == "nq"}
    assert set(skips) == {(3, "answers"), (4, "answer")}
    assert "dict with keys ['value']" in skips[(3, "answers")]
    assert "boolean" in skips[(4, "answer")]


def test_eval_set_names_that_become_extra_eval_names_are_checked_in_the_spec() -> None:
    base = {"train": [{"name": "t", "source": "t.jsonl"}], "corpus": {"source": "c.jsonl"}}
    with pytest.raises(ValueError, match=r"'\.\./x' is not a plain name"):
        _spec(**base, eval={"nq": {"source": "a.jsonl"}, "../x": {"source": "b.jsonl"}})
    with pytest.raises(ValueError, match="'main' is reserved"):
        _spec(**base, eval={"nq": {"source": "a.jsonl"}, "main": {"source": "b.jsonl"}})
    # The primary set becomes data.test_path, not an extra eval set: its name is free.
    assert _spec(**base, eval={"test": {"source": "a.jsonl"}}).primary == "test"
