from __future__ import annotations

import re
from pathlib import Path

import pytest

from searchrl.config import SyntheticWorldConfig
from searchrl.datasets.io import read_manifest, read_passages, read_qa
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.world import write_world
from searchrl.retrieval.bm25 import BM25Index

SMALL = SyntheticWorldConfig(profile="classic", seed=3, n_people=80, n_cities=20,
                             n_countries=6,
                             n_organisations=20, n_train=120, n_dev=30, n_test=40)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a = write_world(generate_world(SMALL), tmp_path / "a")
    b = write_world(generate_world(SMALL), tmp_path / "b")
    assert set(a) == set(b) == {"corpus", "train", "dev", "test"}
    assert all(a[name].stat().st_size > 0 for name in a)
    for name in a:
        assert a[name].read_bytes() == b[name].read_bytes(), name


def test_other_seed_other_world() -> None:
    a = generate_world(SMALL)
    b = generate_world(SMALL.model_copy(update={"seed": 4}))
    assert [p.contents for p in a.passages] != [p.contents for p in b.passages]


def test_splits_have_no_question_or_anchor_overlap() -> None:
    world = generate_world(SMALL)
    questions = {s: {q.question for q in rows} for s, rows in world.splits.items()}
    assert not questions["train"] & questions["dev"]
    assert not questions["train"] & questions["test"]
    assert not questions["dev"] & questions["test"]
    # Every person or organisation a test question is about appears in no train question.
    names = set(world.people) | set(world.orgs)

    def anchors(split: str) -> set[str]:
        return {n for q in world.splits[split] for n in names if n in q.question}

    assert not anchors("train") & anchors("test")


def test_hop_mix_and_supporting_passages_hold_the_answer() -> None:
    world = generate_world(SMALL)
    by_id = {p.id: p for p in world.passages}
    hops = {q.hops for rows in world.splits.values() for q in rows}
    assert hops == {1, 2, 3}
    for rows in world.splits.values():
        for q in rows:
            assert q.hops == len(q.supporting_doc_ids)
            last = by_id[q.supporting_doc_ids[-1]]
            assert q.golden_answers[0] in last.contents
            # The first hop's passage is about the entity the question names.
            assert by_id[q.supporting_doc_ids[0]].title in q.question


def test_answers_exist_only_in_the_corpus_not_in_questions() -> None:
    world = generate_world(SMALL)
    contents = [p.contents for p in world.passages]
    questions = [q for rows in world.splits.values() for q in rows]
    assert len(questions) == SMALL.n_train + SMALL.n_dev + SMALL.n_test
    for q in questions:
        assert q.golden_answers[0] not in q.question, q.id
        assert any(q.golden_answers[0] in text for text in contents), q.id


def test_distractors_are_near_namesakes() -> None:
    world = generate_world(SMALL)
    titles = {p.title for p in world.passages}
    person = next(iter(world.people))
    first, last = person.split(" ", 1)
    assert f"{first} {last}son" in titles


def test_written_world_round_trips_with_manifests(tmp_path: Path) -> None:
    paths = write_world(generate_world(SMALL), tmp_path)
    assert len(read_passages(paths["corpus"])) == len(generate_world(SMALL).passages)
    train = read_qa(paths["train"])
    manifest = read_manifest(paths["train"])
    assert manifest is not None and manifest["rows"] == len(train)
    assert all(re.fullmatch(r"train-\d{5}", q.id) for q in train)


def test_every_entity_is_the_top_bm25_hit_for_its_own_name() -> None:
    """The demo searches a chain entity by its exact name and (at the demo's top_k=1) keeps
    only the first hit: a distractor that outranks the entity's own passage makes every
    question through that entity unanswerable and drops it from the SFT demos (issue 25:
    "New <org>" twins hid all five organisation types)."""
    world = generate_world(SMALL)
    bm25 = BM25Index.build([p.contents for p in world.passages])
    names = sorted(world.doc_of)
    row_of = {p.id: i for i, p in enumerate(world.passages)}
    ranked = bm25.search(names, top_k=1)
    missed = [n for n, hits in zip(names, ranked, strict=True)
              if hits[0][0] != row_of[world.doc_of[n]]]
    assert not missed, f"{len(missed)} entities lose to another passage, e.g. {missed[:3]}"


def test_organisation_distractors_share_the_name_but_not_the_kind() -> None:
    world = generate_world(SMALL)
    titles = [p.title for p in world.passages]
    assert len(titles) == len(set(titles)), "passage titles must be unique"
    for org in world.orgs:
        word, kind = org.rsplit(" ", 1)
        twins = [t for t in titles if t != org and t.startswith(f"{word} ")]
        assert twins and all(not t.endswith(f" {kind}") for t in twins), (org, twins)


def test_too_many_organisation_distractors_name_the_setting() -> None:
    many = SMALL.model_copy(update={"distractors_per_entity": 5})
    with pytest.raises(ValueError, match="distractors_per_entity"):
        generate_world(many)
