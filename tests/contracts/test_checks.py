"""Pure checks: the Aho-Corasick answer index, near-duplicate prefix filtering
(against brute force), grouping by question, time-sensitive terms."""

from __future__ import annotations

import random
import typing

import pytest

from searchrl.config import GoldCheck
from searchrl.text import normalize_answer
from searchrl.types import Passage, QAExample
from searchrl.validation.answerability import find_answers
from searchrl.validation.checks import (
    CHECK_DESCRIPTIONS,
    CheckedRow,
    answer_variant_flags,
    answerability_flags,
    leakage_flags,
    near_duplicate_leakage_flags,
    question_group_flags,
    time_sensitive_flags,
)


def row(split: str, n: int, question: str, answers: list[str],
        support: tuple[str, ...] = ()) -> CheckedRow:
    return CheckedRow(split, n, QAExample(id=f"{split}{n}", question=question,
                                          golden_answers=tuple(answers),
                                          supporting_doc_ids=support))


def test_check_names_match_config_literal() -> None:
    assert set(CHECK_DESCRIPTIONS) == set(typing.get_args(GoldCheck))


def test_find_answers_whole_token_and_first_hit_in_corpus_order() -> None:
    corpora = [("main", [Passage(id="a", contents="Signed in 19190 by nobody."),
                         Passage(id="b", contents="The treaty was signed in 1919.")]),
               ("extra", [Passage(id="c", title="Paris", contents="Capital of France."),
                          Passage(id="d", contents="Also 1919 here.")])]
    hits = find_answers(["1919", "paris", "london", ""], corpora)
    assert hits["1919"].passage_id == "b"
    assert (hits["paris"].passage_id, hits["paris"].corpus) == ("c", "extra")  # via the title
    assert "london" not in hits


def _brute_force(rows: list[CheckedRow], t: float) -> set[tuple[int, int]]:
    out = set()
    for a in rows:
        for b in rows:
            if a.split != "train" or b.split == "train":
                continue
            na, nb = normalize_answer(a.example.question), normalize_answer(b.example.question)
            sa, sb = set(na.split()), set(nb.split())
            if na != nb and sa and len(sa & sb) / len(sa | sb) >= t:
                out.add((a.row, b.row))
    return out


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.9])
def test_near_duplicate_prefix_filter_equals_brute_force(threshold: float) -> None:
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(60)]
    base = [rng.sample(vocab, rng.randint(3, 22)) for _ in range(40)]
    rows = []
    for i in range(160):
        words = list(rng.choice(base))
        for _ in range(rng.randint(0, 2)):  # small edits: near-duplicates of a base question
            words[rng.randrange(len(words))] = rng.choice(vocab)
        if rng.random() < 0.3:
            words.append(rng.choice(vocab))
        rows.append(row("train" if i < 100 else rng.choice(["dev", "test"]), i,
                        " ".join(words) + "?", ["x"]))
    flags = near_duplicate_leakage_flags(rows, threshold)
    found = {(f.row, f.evidence["eval_row"]["row"]) for f in flags}
    expected = _brute_force(rows, threshold)
    assert expected  # the generator must make some near-duplicates, or this proves nothing
    assert found == expected


def test_question_groups_duplicate_conflict_variant_and_exact_leakage() -> None:
    rows = [row("train", 1, "Who wrote Hamlet?", ["Shakespeare"]),
            row("train", 2, "who wrote hamlet", ["Shakespeare"]),          # duplicate
            row("train", 3, "When did it end?", ["1919"]),
            row("test", 1, "When did it end", ["the year 1919"]),         # variant + leakage
            row("dev", 1, "Who is the mayor?", ["Ann"]),
            row("dev", 2, "Who is the mayor", ["Bob"])]                   # conflict
    got = {(f.split, f.row, f.check) for f in question_group_flags(rows)}
    assert got == {("train", 2, "duplicate_question"),
                   ("train", 3, "answer_variant"), ("test", 1, "answer_variant"),
                   ("train", 3, "leakage_exact"),
                   ("dev", 1, "conflicting_gold"), ("dev", 2, "conflicting_gold")}


def test_leakage_is_flagged_even_when_the_gold_conflicts() -> None:
    rows = [row("train", 1, "How tall is Mount Zorb?", ["9 metres"]),
            row("test", 1, "how tall is mount zorb", ["4,200 metres"])]
    got = {(f.split, f.row, f.check) for f in question_group_flags(rows)}
    assert got == {("train", 1, "conflicting_gold"), ("test", 1, "conflicting_gold"),
                   ("train", 1, "leakage_exact")}


def test_leakage_flags_alone_for_rows_without_usable_gold() -> None:
    no_gold = CheckedRow("train", 7, QAExample.model_construct(
        id="k", question="Where was Orin Tal born?", golden_answers=(), supporting_doc_ids=()))
    near = CheckedRow("train", 8, QAExample.model_construct(
        id="n", question="Where was the painter Orin Tal born?", golden_answers=(),
        supporting_doc_ids=()))
    evals = [row("test", 1, "where was orin tal born", ["Brisk"]),
             row("test", 2, "Where was the painter Orin Tal born in?", ["Brisk"])]
    got = {(f.row, f.check) for f in leakage_flags([no_gold, near, *evals], 0.8)}
    # Only leakage, only on train rows: no conflicting_gold for the empty gold list.
    assert got == {(7, "leakage_exact"), (8, "leakage_near")}


def test_answer_variant_within_row() -> None:
    flags = answer_variant_flags([row("train", 1, "q?", ["The Beatles", "beatles"]),
                                  row("train", 2, "q2?", ["1919", "year 1919"])])
    assert [(f.row, f.check) for f in flags] == [(1, "answer_variant")]


def test_time_sensitive_whole_words_only() -> None:
    rows = [row("train", 1, "Who is the CURRENT mayor?", ["x"]),
            row("train", 2, "What is a currant?", ["x"]),
            row("train", 3, "Who won the latest race this year?", ["x"])]
    flags = time_sensitive_flags(rows, ("current", "latest", "this year"))
    assert [(f.row, f.evidence["term"]) for f in flags] == [(1, "CURRENT"), (3, "latest")]


def test_answerability_flags() -> None:
    corpora = {"c": [Passage(id="p1", contents="Paris is in France."),
                     Passage(id="p2", contents="Lyon is a city.")]}
    rows = [row("train", 1, "q1?", ["Paris"], ("p1",)),          # fine
            row("train", 2, "q2?", ["Berlin"], ("p1",)),          # unanswerable
            row("train", 3, "q3?", ["Paris"], ("p2",)),           # not in supporting
            row("train", 4, "q4?", ["Lyon"], ("p2", "p9")),       # unknown support id
            row("train", 5, "q5?", ["yes"], ("p1",))]             # judgement: not looked up
    got = {(f.row, f.check) for f in answerability_flags(rows, corpora, ("yes", "no"))}
    assert got == {(2, "unanswerable"), (3, "not_in_supporting"), (4, "unknown_supporting_doc")}
