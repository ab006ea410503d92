"""evaluate(): every system through the real rollout loop (tiny random policy, fake searcher),
files written, results round-trip, paired deltas of identical systems are exactly zero."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from searchrl.config import PipelineConfig
from searchrl.data.io import read_manifest
from searchrl.eval.baselines import TRAINED, SystemSpec, plan_systems
from searchrl.eval.run import RESULTS_FILE, evaluate, load_eval_result, read_question_results
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.types import QAExample, SearchHit

DOCS = {"d1": "Acme was founded by Bob Smith.", "d2": "Bob Smith was born in Zorvik.",
        "d3": "Zorvik is a city located in Brelia."}


class FakeSearcher:
    """Always returns d1 first: questions supported by d1 are 'retrieved'."""

    def __init__(self) -> None:
        self.calls = 0

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        self.calls += 1
        hits = [SearchHit(k, None, v, 1.0) for k, v in DOCS.items()][:top_k]
        return [hits for _ in queries]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = PipelineConfig()
    tok = train_tokenizer(list(DOCS.values()) * 5, vocab_size=300)
    model = build_tiny_model(cfg.model.tiny.model_copy(update={"n_layer": 1, "n_embd": 32,
                                                                 "n_head": 2}), tok)
    out = tmp_path_factory.mktemp("policy")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _config() -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"device": "cpu"}, "model": {"tiny": {"n_layer": 1, "n_embd": 32, "n_head": 2}},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 6, "max_response_tokens": 120,
                    "top_k": 2, "info_token_budget": 40},
        "eval": {"bootstrap_samples": 100, "batch_size": 2},
    })


EXAMPLES = [QAExample(id=f"q{i}", question=f"Who founded Acme {i}?", golden_answers=("Bob",),
                      hops=1 + i % 2, type="org_founder",
                      supporting_doc_ids=("d1",) if i % 2 else ("d9",)) for i in range(5)]


def test_evaluate_writes_complete_results(policy_dir: Path, tmp_path: Path) -> None:
    config = _config()
    systems = [SystemSpec("sft", str(policy_dir), "agentic", "same weights"),
               SystemSpec("no_search", str(policy_dir), "no_search", "direct"),
               SystemSpec("retrieve_once", str(policy_dir), "retrieve_once", "rag"),
               SystemSpec(TRAINED, str(policy_dir), "agentic", "trained")]
    searcher = FakeSearcher()
    result = evaluate(EXAMPLES, systems, searcher, config, tmp_path, eval_set="test")
    assert list(result.systems) == ["sft", "no_search", "retrieve_once", TRAINED]
    assert result.n_questions == 5
    # Identical weights + greedy decoding -> identical answers -> a zero paired delta.
    assert result.deltas["sft"].mean == result.deltas["sft"].lo == result.deltas["sft"].hi == 0
    nos = read_question_results(result.systems["no_search"].questions_path)
    assert [r.example_id for r in nos] == [e.id for e in EXAMPLES]
    assert all(r.searches == 0 and r.retrieved_support in (False, None) for r in nos)
    rag = read_question_results(result.systems["retrieve_once"].questions_path)
    # The fake retriever returns d1 for every question: support found iff d1 supports it.
    assert [r.retrieved_support for r in rag] == [False, True, False, True, False]
    assert all(r.searches == 0 and r.prompt_tokens > 0 for r in rag)
    for s in result.systems.values():
        assert s.summary.n == 5 and set(s.by_hops) == {"1-hop", "2-hop"}
        assert read_manifest(s.questions_path) is not None
    assert read_manifest(result.suspects_path) is not None
    loaded = load_eval_result(tmp_path / RESULTS_FILE)
    assert json.dumps(loaded.to_dict(), sort_keys=True) == json.dumps(result.to_dict(),
                                                                     sort_keys=True)


def test_evaluate_refuses_without_trained_or_examples(policy_dir: Path, tmp_path: Path) -> None:
    sft = SystemSpec("sft", str(policy_dir), "agentic", "")
    with pytest.raises(ValueError, match="trained"):
        evaluate(EXAMPLES, [sft], FakeSearcher(), _config(), tmp_path, eval_set="test")
    with pytest.raises(ValueError, match="empty"):
        evaluate([], [sft], FakeSearcher(), _config(), tmp_path, eval_set="test")
    assert not (tmp_path / RESULTS_FILE).exists()


def test_plan_systems_skips_what_cannot_run_with_a_note() -> None:
    cfg = PipelineConfig()
    specs, notes = plan_systems(("no_search", "retrieve_once", "sft", "champion"),
                                policy_dir="P", sft_dir=None, champion_dir=None, config=cfg)
    assert [s.name for s in specs] == [TRAINED]
    assert len(notes) == 4 and any("champion" in n for n in notes)
    specs, notes = plan_systems(("no_search", "sft", "champion", "base_agentic"),
                                policy_dir="P", sft_dir="S", champion_dir="C", config=cfg)
    assert [(s.name, s.policy, s.mode) for s in specs] == [
        ("no_search", "S", "no_search"), ("sft", "S", "agentic"), ("champion", "C", "agentic"),
        ("base_agentic", "random-init:S", "agentic"), (TRAINED, "P", "agentic")]
    assert notes == []
