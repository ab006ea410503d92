"""The default (`reading`) synthetic world: what each slice promises holds in the data."""

from __future__ import annotations

import re

import pytest

from searchrl.config import IndexConfig, SyntheticWorldConfig
from searchrl.datasets.reading_world import (
    BORN_CITY,
    FOUNDED_YEAR,
    QUESTION_FORMS,
    SLICE_CARD,
    TRAIN_FORMS,
    ReadingWorld,
    generate_reading_world,
)
from searchrl.datasets.synthetic import generate_world
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.train.cold_start.demos import build_demos

CFG = SyntheticWorldConfig(seed=5, n_people=160, n_cities=20, n_countries=6,
                           n_organisations=40, n_train=300, n_dev=150, n_test=250)


@pytest.fixture(scope="module")
def world() -> ReadingWorld:
    got = generate_world(CFG)
    assert isinstance(got, ReadingWorld)
    return got


def _form_of(question: str, qtype: str) -> int | None:
    for i, form in enumerate(QUESTION_FORMS[qtype]):
        pattern = re.escape(form).replace(r"\{X\}", ".+").replace(r"\{A\}", ".+").replace(
            r"\{B\}", ".+")
        if re.fullmatch(pattern, question, flags=re.IGNORECASE):
            return i
    return None


def test_same_config_same_world_other_seed_other_world() -> None:
    a, b = generate_reading_world(CFG), generate_reading_world(CFG)
    assert [p.contents for p in a.passages] == [p.contents for p in b.passages]
    assert a.splits == b.splits
    c = generate_reading_world(CFG.model_copy(update={"seed": 6}))
    assert [p.contents for p in c.passages] != [p.contents for p in a.passages]


def test_enough_phrasings_and_sentence_forms() -> None:
    assert all(len(forms) >= 4 for forms in QUESTION_FORMS.values())
    assert len(BORN_CITY) >= 3 and len(FOUNDED_YEAR) >= 3


def test_train_uses_train_forms_only_and_held_out_forms_are_tagged(world: ReadingWorld) -> None:
    for ex in world.splits["train"]:
        assert ex.type is not None
        assert _form_of(ex.question, ex.type) in TRAIN_FORMS, ex.question
        assert "unseen_phrasing" not in ex.slices
    for split in ("dev", "test"):
        unseen = 0
        for ex in world.splits[split]:
            assert ex.type is not None
            form = _form_of(ex.question, ex.type)
            assert form is not None, ex.question
            assert ("unseen_phrasing" in ex.slices) == (form not in TRAIN_FORMS)
            unseen += form not in TRAIN_FORMS
        assert unseen >= 0.4 * len(world.splits[split])


def test_answer_novel_slice_is_true_and_large_enough(world: ReadingWorld) -> None:
    train_answers = {a for ex in world.splits["train"] for a in ex.golden_answers}
    test = world.splits["test"]
    novel = [ex for ex in test if "answer_novel" in ex.slices]
    assert all(ex.golden_answers[0] not in train_answers for ex in novel)
    assert all(ex.golden_answers[0] in train_answers for ex in test if ex not in novel)
    assert len(novel) >= 0.3 * len(test)


def test_every_slice_occurs_and_has_a_card(world: ReadingWorld) -> None:
    seen = {s for ex in world.splits["test"] for s in ex.slices}
    assert seen == set(SLICE_CARD)


def test_comparisons_answer_the_earlier_of_their_two_names(world: ReadingWorld) -> None:
    by_id = {p.id: p for p in world.passages}
    comparisons = [ex for rows in world.splits.values() for ex in rows
                   if "comparison" in ex.slices]
    assert comparisons
    for ex in comparisons:
        assert len(ex.supporting_doc_ids) == 2
        years = [int(re.findall(r"\b(1[6-9]\d\d|20\d\d)\b", by_id[d].contents)[-1]
                     if ex.type == "compare_org_founded"
                     else re.findall(r"\b(1[6-9]\d\d)\b", by_id[d].contents)[-1])
                 for d in ex.supporting_doc_ids]
        names = [by_id[d].title.split(" (")[0] for d in ex.supporting_doc_ids]
        assert all(n in ex.question for n in names)
        assert ex.golden_answers[0] == names[years.index(min(years))], ex.question


def test_aliases_namesakes_and_cross_passage_facts(world: ReadingWorld) -> None:
    by_id = {p.id: p for p in world.passages}
    rows = [ex for r in world.splits.values() for ex in r]
    alias = [ex for ex in rows if "alias" in ex.slices]
    namesake = [ex for ex in rows if "namesake" in ex.slices]
    cross = [ex for ex in rows if "cross_passage" in ex.slices]
    assert alias and namesake and cross
    # An aliased hop's query is not its passage's title, and that passage introduces it.
    assert any(q != by_id[d].title for ex in alias
               for q, d in zip(ex.search_queries, ex.supporting_doc_ids, strict=True))
    for ex in alias:  # some passage of its chain introduces the alias it needs
        assert any(re.search(r"known as [A-Z]|called [A-Z][a-z]+ for short", by_id[d].contents)
                   for d in ex.supporting_doc_ids), ex.question
    # Namesakes: two passages share a name and differ by profession.
    titles = [p.title or "" for p in world.passages]
    assert any(t.endswith(")") and sum(u.startswith(t.split(" (")[0] + " (") for u in titles)
               == 2 for t in titles)
    # Cross-passage: the answer is read in fewer passages than the question has hops.
    for ex in cross:
        assert len(ex.supporting_doc_ids) < (ex.hops or 0) + 1
        assert ex.golden_answers[0] in by_id[ex.supporting_doc_ids[-1]].contents


def test_held_out_anchors_appear_in_no_train_question(world: ReadingWorld) -> None:
    by_id = {p.id: p for p in world.passages}
    train_first = {by_id[ex.supporting_doc_ids[0]].id for ex in world.splits["train"]}
    test_first = {by_id[ex.supporting_doc_ids[0]].id for ex in world.splits["test"]}
    assert not train_first & test_first


def test_every_gold_chain_is_retrievable_at_top_1(world: ReadingWorld) -> None:
    """The cold start's demonstrations search the gold queries: none may be skipped."""
    icfg = IndexConfig(retriever="bm25")
    bm25 = BM25Index.build([p.contents for p in world.passages], k1=icfg.bm25_k1, b=icfg.bm25_b,
                           stopwords=icfg.bm25_stopwords)
    searcher = LocalSearcher(world.passages, icfg, bm25=bm25)
    demos, stats = build_demos(world.splits["test"], {p.id: p for p in world.passages},
                               searcher, prompt_fn=lambda q: q, top_k=1,
                               imperfect_fraction=0.0)
    assert stats.skipped_gold_not_retrieved == 0 and stats.skipped_no_chain == 0
    assert len(demos) == len(world.splits["test"])
    by_id = {ex.id: ex for ex in world.splits["test"]}
    for demo in demos:  # each hop searches the gold query (an alias, a namesake's profession)
        searches = [t.split("<search>")[1].split("</search>")[0].strip()
                    for t, _ in demo.segments if "<search>" in t]
        assert searches == list(by_id[demo.example_id].search_queries)


def test_no_question_is_asked_twice(world: ReadingWorld) -> None:
    """Validation quarantines duplicates; the generator must not make them."""
    questions = [ex.question for rows in world.splits.values() for ex in rows]
    assert len(questions) == len(set(questions))
