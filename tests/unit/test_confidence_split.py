"""Accuracy by retrieval confidence (hit scores kept in rollout records, terciles of the first
search's top-1 score), the train-split audit in the evaluate stage, and both in the report."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from searchrl.config import PipelineConfig
from searchrl.datasets.io import read_manifest, write_jsonl
from searchrl.eval.audit import GOLD_LIKELY_WRONG, POLICY_ERROR
from searchrl.eval.baselines import TRAINED, SystemSpec
from searchrl.eval.metrics import (
    QuestionResult,
    breakdown,
    by_confidence,
    summarize,
    tercile_cuts,
)
from searchrl.eval.results import (
    RESULTS_FILE,
    AuditSummary,
    EvalResult,
    SystemResult,
    load_eval_result,
    read_question_results,
)
from searchrl.eval.run import TRAIN_SUSPECTS_FILE, audit_train_split, evaluate
from searchrl.gate.payback import StageCost
from searchrl.gate.render import render_html, render_markdown
from searchrl.gate.report import build_gate
from searchrl.rl.records import RolloutRecord
from searchrl.types import QAExample, SearchHit
from tests.helpers import save_tiny_policy

DOCS = {"d1": "Acme was founded by Bob Smith.", "d2": "Bob Smith was born in Zorvik."}


class ScoredSearcher:
    """d1 then d2, with scores that differ per query so a bucket is visible."""

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        return [[SearchHit("d1", None, DOCS["d1"], 2.0 + len(q) / 100),
                 SearchHit("d2", None, DOCS["d2"], 0.5)][:top_k] for q in queries]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(DOCS.values(), tmp_path_factory.mktemp("policy"))


def _config(**eval_cfg: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"device": "cpu"}, "model": {"tiny": {"n_layer": 1, "n_embd": 32, "n_head": 2}},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 4, "max_response_tokens": 80,
                    "top_k": 2, "info_token_budget": 30},
        "eval": {"bootstrap_samples": 100, "batch_size": 4} | eval_cfg})


EXAMPLES = [QAExample(id=f"q{i}", question=f"Who founded Acme {'x' * i}?",
                      golden_answers=("Bob Smith",), hops=1, type="org_founder",
                      supporting_doc_ids=("d1",)) for i in range(4)]


def _q(i: int, *, searches: int = 1, score: float | None = None, em: float = 0.0
       ) -> QuestionResult:
    return QuestionResult(example_id=f"q{i}", hops=1, qtype="t", em=em, f1=em,
                          searches=searches, format_ok=True, prompt_tokens=10,
                          response_tokens=5, latency_s=0.0, answered=True,
                          finish_reason="answer", top_score=score)


def test_terciles_of_the_first_search_score_plus_no_search_and_no_hits() -> None:
    results = [_q(i, score=float(i), em=float(i > 6)) for i in range(1, 10)]
    results += [_q(10, searches=0, score=5.0), _q(11, searches=0), _q(12, score=None)]
    cuts = tercile_cuts([r.top_score for r in results if r.searched and r.top_score])
    assert cuts == pytest.approx((11 / 3, 19 / 3))
    groups = breakdown(results, by_confidence(cuts), samples=100)
    # retrieve_once's template retrieval has a score but is not the policy's search
    assert {k: v.n for k, v in groups.items()} == {"no_hits": 1, "no_search": 2, "q1_low": 3,
                                                   "q2_mid": 3, "q3_high": 3}
    assert groups["q3_high"].em.mean == 1.0 and groups["q1_low"].em.mean == 0.0
    assert tercile_cuts([]) is None
    assert {by_confidence(None)(r) for r in results} == {"no_search", "no_hits"}


def test_old_records_load_without_scores() -> None:
    rec = RolloutRecord(example_id="q", sample_index=0, prompt_ids=[], response_ids=[],
                        loss_mask=[], old_logprobs=[], text="", turns=0)
    assert rec.retrieval_scores == []
    assert QuestionResult.from_dict({k: v for k, v in dataclasses.asdict(_q(0)).items()
                                     if k != "top_score"}).top_score is None


def test_evaluate_keeps_hit_scores_and_writes_the_confidence_split(policy_dir: Path,
                                                                   tmp_path: Path) -> None:
    systems = [SystemSpec("retrieve_once", str(policy_dir), "retrieve_once", "rag"),
               SystemSpec(TRAINED, str(policy_dir), "agentic", "trained")]
    result = evaluate(EXAMPLES, systems, ScoredSearcher(), _config(), tmp_path, eval_set="test")
    rag = read_question_results(result.systems["retrieve_once"].questions_path)
    assert [r.top_score for r in rag] == pytest.approx([2.0 + len(e.question) / 100
                                                        for e in EXAMPLES])
    saved = json.loads((tmp_path / RESULTS_FILE).read_text())
    for name in ("retrieve_once", TRAINED):
        split = saved["systems"][name]["by_confidence"]
        assert sum(v["n"] for v in split.values()) == 4 and "em" in next(iter(split.values()))
    assert saved["systems"]["retrieve_once"]["by_confidence"]["no_search"]["n"] == 4
    assert "confidence_cuts" in saved and saved["audit"]["split"] == "test"
    assert set(saved["audit"]["tiers"]) == {"gold_likely_wrong", "gold_possibly_wrong",
                                            "policy_error"}
    loaded = load_eval_result(tmp_path / RESULTS_FILE)
    assert json.dumps(loaded.to_dict(), sort_keys=True) == json.dumps(result.to_dict(),
                                                                     sort_keys=True)


def test_train_split_audit_is_sampled_capped_and_removable(policy_dir: Path,
                                                          tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    write_jsonl(train, [e.model_dump(mode="json") for e in EXAMPLES])
    out = tmp_path / "eval"
    out.mkdir()
    got = audit_train_split(_config(audit_train_questions=3), train, str(policy_dir),
                            ScoredSearcher(), out)
    assert got is not None and got.n_questions == 3 and got.split == "train"
    assert got.systems == ("sft",) and read_manifest(out / TRAIN_SUSPECTS_FILE) is not None
    # Off: no summary, and no stale file from an earlier run.
    assert audit_train_split(_config(audit_train_questions=0), train, str(policy_dir),
                             ScoredSearcher(), out) is None
    assert not (out / TRAIN_SUSPECTS_FILE).exists()
    assert audit_train_split(_config(), tmp_path / "none.jsonl", str(policy_dir),
                             ScoredSearcher(), out) is None


def _suspect(eid: str, tier: str, split: str = "test") -> dict[str, object]:
    return {"key": f"{split}/{eid}", "split": split, "example_id": eid, "rank": 1,
            "question": f"Who founded <{eid}>?", "golden_answers": ["Bob"], "answer": "Rob",
            "confidence": 0.9, "score": 0.9, "tier": tier, "answer_doc": "d1",
            "answer_snippet": "Acme was founded by Rob.", "gold_doc": None, "gold_snippet": "",
            "gold_in_support": False, "flagged_by": ["trained"], "decision": ""}


def test_report_shows_confidence_table_and_audit_tiers(tmp_path: Path) -> None:
    results = [_q(i, score=float(i), em=float(i > 3)) for i in range(1, 7)] + [
        _q(7, searches=0)]
    cuts = tercile_cuts([float(i) for i in range(1, 7)])
    summary = summarize(results, samples=100)
    spec = SystemSpec(TRAINED, "p", "agentic", "trained")
    system = SystemResult(spec=spec, summary=summary, by_hops={}, by_type={}, by_searched={},
                          questions_path="", trajectories_path="", seconds=1.0,
                          by_confidence=breakdown(results, by_confidence(cuts), samples=100))
    spath, tpath = tmp_path / "s.jsonl", tmp_path / "t.jsonl"
    write_jsonl(spath, [_suspect("q1", GOLD_LIKELY_WRONG), _suspect("q2", POLICY_ERROR)])
    write_jsonl(tpath, [_suspect("t1", GOLD_LIKELY_WRONG, "train")])
    ev = EvalResult(eval_set="test", n_questions=7, systems={TRAINED: system}, deltas={},
                    suspects_path=str(spath), n_suspects=2, confidence_cuts=cuts,
                    train_audit=AuditSummary(str(tpath), "train", 32, ("sft",),
                                             {GOLD_LIKELY_WRONG: 1}))
    config = PipelineConfig.model_validate({"gate": {"min_gold_pairs": 1}})
    _, report = build_gate(config, ev, gold_pairs=10, training_curve={},
                           stages=[StageCost("training", 60.0, 1)])
    md = render_markdown(report)
    assert "## By retrieval confidence" in md
    assert "| trained | low | <= 2.667 | 2 |" in md and "| trained | no search |  | 1 |" in md
    assert "2 suspect gold labels, 1 gold likely wrong" in md
    assert "| test (all questions) | gold likely wrong |" in md
    assert "| train (32 sampled questions) | gold likely wrong |" in md
    assert "Audit, test (all questions): gold likely wrong (1, top 1" in md
    assert "| 1 | train/t1 |" in md and "d1: Acme was founded by Rob." in md
    page = render_html(report, figures={})
    assert 'id="audit-train-gold_likely_wrong"' in page and "&lt;q1&gt;" in page
    assert 'id="confidence"' in page
