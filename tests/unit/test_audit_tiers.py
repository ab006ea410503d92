"""The label-noise audit's tiers, measured on a synthetic world with planted wrong gold labels,
and the steward's way back: suspect rows -> `apply-audit` -> overrides -> validation."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from searchrl.__main__ import main
from searchrl.config import SyntheticWorldConfig
from searchrl.datasets.io import read_qa
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.world import World
from searchrl.eval.audit import (
    GOLD_LIKELY_WRONG,
    GOLD_POSSIBLY_WRONG,
    POLICY_ERROR,
    audit_rollouts,
    classify,
    pool_suspects,
    tier_counts,
)
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rewards import exact_match
from searchrl.types import QAExample
from searchrl.validation.overrides import OverridesError, load_overrides, merge_audit_decisions
from searchrl.validation.validate import validate_gold_labels
from tests.contracts.conftest import make_defects_config

# --- the fixture: a world, wrong golds planted, deterministic rollouts


def _passage_text(world: World) -> dict[str, str]:
    # As the rollout records them (rl/prompts.format_passages of one hit).
    return {p.id: f"Doc 1 (Title: {p.title}) {p.contents}" for p in world.passages}


def _record(ex: QAExample, answer: str, retrieved: list[str], texts: dict[str, str],
            sample: int = 0) -> RolloutRecord:
    em = exact_match(answer, ex.golden_answers)
    # prompt | search turn (sampled) | information | answer turn (sampled, confident)
    return RolloutRecord(
        example_id=ex.id, sample_index=sample, prompt_ids=[1], response_ids=list(range(6)),
        loss_mask=[1, 1, 0, 0, 1, 1], old_logprobs=[-1.0, -1.0, 0, 0, math.log(0.9),
                                                    math.log(0.9)],
        text="", turns=2, queries=[ex.question], retrieved_doc_ids=[retrieved],
        passages=[[texts[d] for d in retrieved]], answer=answer, correct=em > 0,
        reward_parts={"format": 1.0, "em": em, "f1": 0.0})


def _misspell(name: str) -> str:
    """What the policy does to names it read: drops the tail of the last word."""
    head, _, last = name.rpartition(" ")
    return f"{head} {last[:max(2, len(last) - 3)]}".strip()


def planted_world(n_planted: int = 10, seed: int = 0
                  ) -> tuple[dict[str, QAExample], list[RolloutRecord], set[str]]:
    """Test questions of a synthetic world, `n_planted` with a wrong gold (another question's
    answer of the same type), and one greedy rollout per question:

    - planted: the policy answers the true answer, having read every supporting passage;
      except one 2+-hop question where it read only the last one (the audit cannot rule out
      that the gold is in the unread passage: an expected miss);
    - the rest, in turn: correct; a misspelling of the gold (support read); the bridge or
      subject entity (support read); the bridge entity with the gold's passage unread (the
      answer is in a supporting passage and the gold is not in what was read); a city named
      nowhere in what was read.
    """
    world = generate_world(SyntheticWorldConfig(profile="classic", seed=seed, n_train=20,
                                                n_dev=10, n_test=90))
    texts = _passage_text(world)
    title = {p.id: p.title for p in world.passages}
    rng = random.Random(seed)
    test = list(world.splits["test"])
    # Only questions whose type has another answer in the split can get a wrong gold.
    plantable = [ex for ex in test if any(o.type == ex.type and o.golden_answers[0]
                                          != ex.golden_answers[0] for o in test)]
    multi = [ex for ex in plantable if ex.hops >= 2]
    partial_planted = multi[0]
    planted_ids = {partial_planted.id} | {ex.id for ex in rng.sample(
        [ex for ex in plantable if ex.id != partial_planted.id], n_planted - 1)}
    examples: dict[str, QAExample] = {}
    records: list[RolloutRecord] = []
    behaviours = ("correct", "misspelt", "wrong_hop", "wrong_hop_unread", "distractor")
    cities = sorted(world.cities)
    for i, ex in enumerate(test):
        support = list(ex.supporting_doc_ids)
        truth = ex.golden_answers[0]
        if ex.id in planted_ids:
            wrong = next(o.golden_answers[0] for o in test
                         if o.type == ex.type and o.golden_answers[0] != truth)
            examples[ex.id] = ex.model_copy(update={"golden_answers": (wrong,)})
            read = support[-1:] if ex.id == partial_planted.id else support
            records.append(_record(examples[ex.id], truth, read, texts))
            continue
        examples[ex.id] = ex
        kind = behaviours[i % len(behaviours)]
        if kind == "correct":
            answer, read = truth, support
        elif kind == "misspelt":
            answer, read = _misspell(truth), support
        elif kind == "wrong_hop":
            answer, read = title[support[0]], support
        elif kind == "wrong_hop_unread":
            answer, read = title[support[0]], support[:1]
        else:
            named = " ".join(texts[d] for d in support)
            answer, read = next(c for c in cities if c not in named and c != truth), support
        records.append(_record(ex, answer, read, texts))
    return examples, records, planted_ids


def test_top_tier_precision_and_recall_on_planted_wrong_golds() -> None:
    """Measured on this fixture (90 test questions, 10 planted wrong golds; the other 80 in
    five behaviours, 17 of them answered correctly): 73 suspects, which the audit used to list
    as one flat list. Tiers: gold likely wrong 9, gold possibly wrong 34, policy error 30.
    "gold likely wrong" holds 9, all planted: precision 1.00, recall 0.90 (the miss is the
    planted question whose first supporting passage the policy did not read; it is in "gold
    possibly wrong"). Misspellings and distractor answers land in "policy error", wrong hops
    (support read or not) in "gold possibly wrong"."""
    examples, records, planted = planted_world()
    rows = audit_rollouts(records, examples, min_confidence=0.5, split="test")
    top = {r["example_id"] for r in rows if r["tier"] == GOLD_LIKELY_WRONG}
    precision = len(top & planted) / len(top)
    recall = len(top & planted) / len(planted)
    assert precision >= 0.8 and recall >= 0.9, (precision, recall, tier_counts(rows))
    assert (len(rows), precision, recall) == (73, 1.0, 0.9)
    assert tier_counts(rows) == {GOLD_LIKELY_WRONG: 9, GOLD_POSSIBLY_WRONG: 34,
                                 POLICY_ERROR: 30}
    by_id = {r["example_id"]: r for r in rows}
    kinds = {ex_id: by_id[ex_id]["tier"] for ex_id in by_id if ex_id not in planted}
    assert GOLD_LIKELY_WRONG not in kinds.values()
    # Each top-tier row shows its evidence: the passage holding the answer, and the ranking.
    for r in rows:
        if r["tier"] == GOLD_LIKELY_WRONG:
            assert r["answer"] in r["answer_snippet"] and r["answer_doc"]
            assert r["gold_in_support"] is False and r["score"] == pytest.approx(0.9, abs=1e-3)
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert [r["tier"] for r in rows] == sorted(
        (r["tier"] for r in rows),
        key=[GOLD_LIKELY_WRONG, GOLD_POSSIBLY_WRONG, POLICY_ERROR].index)


# --- the rules one at a time

SUPPORT = {"d1": "Doc 1 (Title: Vorn Works) Vorn Works was founded by Leishuchair Tam.",
           "d2": "Doc 1 (Title: Leishuchair Tam) Leishuchair Tam was born in Brelia."}


@pytest.mark.parametrize(("answer", "golds", "read", "tier"), [
    # a misspelling of the gold it read: the policy's error
    ("Leishur Tam", ["Leishuchair Tam"], ["d1"], POLICY_ERROR),
    # the passage names the answer, not the gold, and every supporting passage was read
    ("Leishuchair Tam", ["Leishuchiar Tam"], ["d1", "d2"], GOLD_LIKELY_WRONG),
    # ... but an unread supporting passage might hold the gold
    ("Leishuchair Tam", ["Zed Quor"], ["d1"], GOLD_POSSIBLY_WRONG),
    # both named: the policy answered the wrong hop
    ("Brelia", ["Leishuchair Tam"], ["d1", "d2"], GOLD_POSSIBLY_WRONG),
    # the gold was read and the answer is named nowhere
    ("Quorvik", ["Brelia"], ["d1", "d2"], POLICY_ERROR),
    # a sub-span of the gold is a near-miss however short
    ("Tam", ["Leishuchair Tam"], ["d1", "d2"], POLICY_ERROR),
    # judgement answers: no passage spells out "no", so its absence proves nothing
    ("Brelia", ["no"], ["d1", "d2"], GOLD_POSSIBLY_WRONG),
])
def test_tier_rules(answer: str, golds: list[str], read: list[str], tier: str) -> None:
    got, evidence = classify(answer, golds, {d: SUPPORT[d] for d in read},
                             {d: SUPPORT[d] for d in read}, len(read) == 2)
    assert got == tier, evidence


def test_pooling_ranks_by_agreement_and_gives_each_row_its_steward_fields() -> None:
    base = {"tier": GOLD_LIKELY_WRONG, "confidence": 0.9, "answer": "x"}
    rows = pool_suspects(
        [{**base, "example_id": "a", "system": "trained"},
         {**base, "example_id": "b", "system": "trained", "confidence": 0.95},
         {**base, "example_id": "b", "system": "sft", "tier": POLICY_ERROR, "confidence": 0.6},
         {**base, "example_id": "c", "system": "sft", "tier": POLICY_ERROR}],
        {"a": 2, "b": 2, "c": 2}, split="test")
    # b: flagged by both systems (score 0.95 x 1), a: by one (0.9 x 0.5); c: a lower tier.
    assert [(r["example_id"], r["tier"], r["score"]) for r in rows] == [
        ("b", GOLD_LIKELY_WRONG, 0.95), ("a", GOLD_LIKELY_WRONG, 0.45), ("c", POLICY_ERROR, 0.45)]
    assert rows[0]["flagged_by"] == ["trained", "sft"] and rows[0]["key"] == "test/b"
    assert all(r["decision"] == "" and r["corrected_answers"] == [] for r in rows)


def test_training_rollouts_pool_samples_of_a_question() -> None:
    examples, records, planted = planted_world()
    ex_id = sorted(planted)[1]
    ex = examples[ex_id]
    good = next(r for r in records if r.example_id == ex_id)
    # G = 4 samples: two found the true answer, two answered correctly per the (wrong) gold.
    group = [RolloutRecord(**{**good.__dict__, "sample_index": g}) for g in range(2)]
    group += [RolloutRecord(**{**good.__dict__, "sample_index": g, "answer": ex.golden_answers[0],
                               "correct": True, "reward_parts": {"format": 1.0, "em": 1.0}})
              for g in (2, 3)]
    rows = audit_rollouts(group, examples, min_confidence=0.5, split="train")
    assert len(rows) == 1 and rows[0]["key"] == f"train/{ex_id}"
    assert rows[0]["flagged_by"] == ["0", "1"] and rows[0]["agreement"] == 0.5


# --- the steward's way back

HEADER = "# Steward decisions (comments are kept)\n[]\n"
NOW = datetime(2025, 1, 31, 12, 0, tzinfo=UTC)


def _decisions(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(ex_id: str, decision: str, split: str = "train", **more: Any) -> dict[str, Any]:
    return {"key": f"{split}/{ex_id}", "split": split, "example_id": ex_id,
            "tier": GOLD_LIKELY_WRONG, "golden_answers": ["Quellandia"], "answer": "Quelland",
            "decision": decision, "corrected_answers": [], "reason": "", "steward": "", **more}


def test_apply_audit_merges_idempotently_and_validation_uses_it(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(HEADER)
    decisions = _decisions(tmp_path / "suspects.jsonl", [
        _row("t9", "correct"),                      # corrected to the policy's answer
        _row("t8", "accept", reason="checked: the gold is right", steward="bo"),
        _row("t5", ""), _row("t1", "skip")])        # not decided yet
    first = merge_audit_decisions(decisions, overrides, steward="ana", now=NOW)
    assert [o.id for o in first.added] == ["t9", "t8"] and first.undecided == 2
    text = overrides.read_text()
    assert text.startswith("# Steward decisions") and "[]" not in text
    loaded = {o.id: o for o in load_overrides(overrides)}
    assert loaded["t9"].golden_answers == ("Quelland",) and loaded["t9"].steward == "ana"
    assert loaded["t9"].split == "train" and loaded["t9"].source == "audit:train/t9"
    assert loaded["t9"].decided_at == "2025-01-31T12:00:00+00:00"
    assert "Quellandia" in loaded["t9"].reason and loaded["t8"].steward == "bo"
    # Again: nothing added, the file untouched.
    again = merge_audit_decisions(decisions, overrides, steward="ana", now=NOW)
    assert again.added == [] and again.unchanged == ["train/t9", "train/t8"]
    assert overrides.read_text() == text
    # The next validation applies them (the same rows as tests/contracts/test_validate.py).
    result = validate_gold_labels(make_defects_config(tmp_path, overrides_path=str(overrides)),
                                  tmp_path / "out")
    clean = {ex.id: ex for ex in read_qa(result.split_paths["train"])}
    assert clean["t9"].golden_answers == ("Quelland",) and "t8" in clean


def test_a_conflicting_decision_is_reported_never_overwritten(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("# kept\n- {id: t9, action: accept, reason: fine, steward: bo}\n")
    before = overrides.read_text()
    decisions = _decisions(tmp_path / "d.jsonl", [_row("t9", "correct"),
                                                  _row("t3", "correct", split="test")])
    out = merge_audit_decisions(decisions, overrides, steward="ana", now=NOW)
    assert [o.id for o in out.added] == ["t3"] and len(out.conflicts) == 1
    assert "train/t9" in out.conflicts[0] and "accept" in out.conflicts[0]
    data = yaml.safe_load(overrides.read_text())
    assert data[0] == {"id": "t9", "action": "accept", "reason": "fine", "steward": "bo"}
    assert overrides.read_text().startswith(before.rstrip("\n"))
    assert [o.id for o in load_overrides(overrides)] == ["t9", "t3"]


def test_flow_style_overrides_are_re_emitted_whole(tmp_path: Path) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("# kept\n[{id: a, action: accept, reason: r, steward: s}]\n")
    merge_audit_decisions(_decisions(tmp_path / "d.jsonl", [_row("b", "accept")]), overrides,
                          steward="ana", now=NOW)
    assert overrides.read_text().startswith("# kept\n")
    assert [o.id for o in load_overrides(overrides)] == ["a", "b"]


@pytest.mark.parametrize(("row", "match"), [
    (_row("t9", "fix"), "decision"),
    ({**_row("t9", "accept"), "split": ""}, "split"),
    ({**_row("t9", "correct"), "answer": None}, "corrected_answers"),
])
def test_bad_decision_rows_name_line_and_field(tmp_path: Path, row: dict[str, Any],
                                               match: str) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(HEADER)
    with pytest.raises(OverridesError, match=rf"line 1: field '{match}'"):
        merge_audit_decisions(_decisions(tmp_path / "d.jsonl", [row]), overrides,
                              steward="ana")
    with pytest.raises(OverridesError, match="steward"):
        merge_audit_decisions(_decisions(tmp_path / "e.jsonl", [_row("t9", "accept")]),
                              overrides)
    assert overrides.read_text() == HEADER


def test_cli_apply_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(HEADER)
    decisions = _decisions(tmp_path / "d.jsonl", [_row("t9", "correct")])
    args = ["apply-audit", "--decisions", str(decisions), "--steward", "ana",
            f"validate.overrides_path={overrides}"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["added"] == ["t9"]
    assert main(args) == 0 and json.loads(capsys.readouterr().out)["unchanged"] == ["train/t9"]
    conflict = _decisions(tmp_path / "c.jsonl", [_row("t9", "accept")])
    assert main(["apply-audit", "--decisions", str(conflict), "--steward", "ana",
                 f"validate.overrides_path={overrides}"]) == 1
    assert main(["apply-audit", "--decisions", str(tmp_path / "missing.jsonl")]) == 2
