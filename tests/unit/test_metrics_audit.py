"""The label-noise audit: each condition excludes a trajectory; ranking puts the strongest
evidence first."""

from __future__ import annotations

import dataclasses
import math

import pytest

from searchrl.eval.audit import answer_in_passages, final_turn_confidence, find_suspects
from searchrl.rl.records import RolloutRecord
from searchrl.types import QAExample

EX = {"q1": QAExample(id="q1", question="Who founded Acme?", golden_answers=("Bob Smith",),
                      hops=1, type="org_founder", supporting_doc_ids=("d1",)),
      "q2": QAExample(id="q2", question="Who founded Zeta?", golden_answers=("Ann Lee",),
                      hops=1, type="org_founder", supporting_doc_ids=("d2",)),
      "q3": QAExample(id="q3", question="Unsupported?", golden_answers=("x",))}
PASSAGES = {"d1": "Acme is a firm founded by Rob Smith.", "d2": "Zeta was founded by Ann Lee."}


def _rec(eid: str = "q1", *, answer: str = "Rob Smith", fmt: float = 1.0, em: float = 0.0,
         retrieved: list[list[str]] | None = None, logp: float = math.log(0.9)) -> RolloutRecord:
    # prompt | turn 1 (sampled) | information (inserted) | turn 2 (sampled)
    mask = [1, 1, 0, 0, 0, 1, 1, 1]
    logps = [math.log(0.2), math.log(0.2), 0, 0, 0, logp, logp, logp]
    return RolloutRecord(example_id=eid, sample_index=0, prompt_ids=[1, 2],
                         response_ids=list(range(8)), loss_mask=mask, old_logprobs=logps,
                         text="...", turns=2, queries=["Acme founder"],
                         retrieved_doc_ids=[["d1"]] if retrieved is None else retrieved,
                         answer=answer, reward_parts={"format": fmt, "em": em, "f1": 0.5},
                         correct=em > 0)


def test_confidence_is_over_the_final_sampled_turn_only() -> None:
    assert final_turn_confidence(_rec(logp=math.log(0.5))) == pytest.approx(0.5)
    empty = dataclasses.replace(_rec(), loss_mask=[0, 0], old_logprobs=[0.0, 0.0])
    assert final_turn_confidence(empty) is None


def test_flags_confident_wellformed_supported_wrong_answer() -> None:
    out = find_suspects([_rec()], EX, min_confidence=0.5, passages=PASSAGES, system="trained")
    assert len(out) == 1
    s = out[0]
    assert s["example_id"] == "q1" and s["answer"] == "Rob Smith"
    assert s["golden_answers"] == ["Bob Smith"] and s["answer_in_support"] is True
    assert s["confidence"] == pytest.approx(0.9, abs=1e-3) and s["system"] == "trained"


@pytest.mark.parametrize("change", [
    {"fmt": 0.0},                      # malformed
    {"em": 1.0},                       # scored
    {"retrieved": [["d9"]]},           # support not retrieved
    {"retrieved": []},                 # never searched
    {"logp": math.log(0.3)},           # not confident
    {"answer": "  "},                  # no answer
])
def test_each_condition_excludes(change: dict[str, object]) -> None:
    assert find_suspects([_rec(**change)], EX, min_confidence=0.5) == []  # type: ignore[arg-type]


def test_questions_without_support_ids_are_skipped() -> None:
    assert find_suspects([_rec("q3")], EX, min_confidence=0.0) == []


def test_grounded_answers_rank_first() -> None:
    grounded = _rec("q1", logp=math.log(0.6))
    ungrounded = _rec("q2", answer="Ann Leeson", retrieved=[["d2"]], logp=math.log(0.99))
    out = find_suspects([ungrounded, grounded], EX, min_confidence=0.5, passages=PASSAGES)
    assert [s["example_id"] for s in out] == ["q1", "q2"]
    assert [s["answer_in_support"] for s in out] == [True, False]


def test_unknown_example_raises_naming_it() -> None:
    with pytest.raises(KeyError, match="q404"):
        find_suspects([_rec("q404")], EX, min_confidence=0.5)


def test_record_passages_back_the_grounding_flag_without_a_corpus() -> None:
    rec = dataclasses.replace(_rec(), passages=[[PASSAGES["d1"]]])
    assert find_suspects([rec], EX, min_confidence=0.5)[0]["answer_in_support"] is True
    assert find_suspects([_rec()], EX, min_confidence=0.5)[0]["answer_in_support"] is False


def test_answer_in_passages_is_whole_word_and_normalised() -> None:
    assert answer_in_passages("the Rob Smith", ["Founded by Rob Smith."])
    assert not answer_in_passages("Rob", ["Founded by Robson."])
    assert not answer_in_passages("", ["anything"])
