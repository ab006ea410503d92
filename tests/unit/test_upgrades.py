"""Upgrades: artifacts the pipeline reads back were written by this release and kept as
fixtures (tests/fixtures/formats/, README there); after a simulated format change (the version
constant monkeypatched) the code reuses what it can read, recomputes, or refuses naming the
artifact and what to do: never a traceback, never a silently wrong reuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from searchrl.__main__ import main
from searchrl.config import IndexConfig, PipelineConfig, load_config
from searchrl.eval.results import EvalResultsError, load_eval_result
from searchrl.exit_codes import exit_code_of
from searchrl.retrieval import embedding, index_store
from searchrl.retrieval.embedding import EmbeddingCache, text_hashes
from searchrl.retrieval.index_store import IndexStoreError, build_index, load_searcher
from searchrl.sinks import NullSink
from searchrl.stages import StageInputError, read_ref
from searchrl.train.grpo import checkpoint
from searchrl.train.grpo.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    prepare_checkpoint_dir,
    run_identity,
    verify_checkpoint,
)
from searchrl.types import DatasetRef, Passage, QAExample
from searchrl.validation import drift as drift_module
from searchrl.validation.drift import GoldDigest, compare, reference_digest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "formats"
BM25_ONLY = IndexConfig(retriever="bm25", eval_all_retrievers=False)


@pytest.fixture
def formats(tmp_path: Path) -> Path:
    """A copy of the fixtures, the stage reference's @ROOT@ pointing at the copy."""
    root = tmp_path / "formats"
    shutil.copytree(FIXTURES, root)
    ref = root / "work" / "validate_gold_labels" / "ref.json"
    ref.write_text(ref.read_text().replace("@ROOT@", str(root)))
    return root


# --- stage references (ref.json)


def test_a_stage_reference_of_this_release_is_read_and_another_format_is_a_stage_to_rerun(
        formats: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    stage = formats / "work" / "validate_gold_labels"
    ref = read_ref(DatasetRef, stage, "validate")
    assert ref.paths["train"] == str(stage / "train.jsonl")
    # Written before the stamp: the layout is the first one, read as such.
    data = json.loads((stage / "ref.json").read_text())
    unstamped = {k: v for k, v in data.items() if k != "format_version"}
    (stage / "ref.json").write_text(json.dumps(unstamped))
    assert read_ref(DatasetRef, stage, "validate") == ref
    # A later release that changed the layout: the file is named, the stage to re-run too.
    monkeypatch.setattr("searchrl.refs.READABLE_REF_FORMATS", frozenset({2}))
    with pytest.raises(StageInputError, match=r"ref\.json: reference format 1, this release "
                                              r"reads \[2\]; re-run `python -m searchrl "
                                              r"validate`"):
        read_ref(DatasetRef, stage, "validate")
    monkeypatch.undo()
    # A field this release does not know (a newer release's ref): no TypeError traceback.
    (stage / "ref.json").write_text(json.dumps({**data, "shard_index": {"a": 1}}))
    with pytest.raises(StageInputError, match="not a DatasetRef this release reads"):
        read_ref(DatasetRef, stage, "validate")
    # Through the CLI: exit 3 with the message alone.
    cfg = formats / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"run": {"work_dir": str(formats / "work")}}))
    capsys.readouterr()
    assert main(["index", "--config", str(cfg)]) == 3
    err = capsys.readouterr().err
    assert "not a DatasetRef this release reads" in err and "Traceback" not in err


def test_evaluation_results_of_this_release_are_read_and_another_format_is_refused(
        formats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = formats / "work" / "evaluate_policy" / "results.json"
    result = load_eval_result(path)
    assert result.n_questions == 60 and set(result.systems) == {"retrieve_once", "trained"}
    monkeypatch.setattr("searchrl.eval.results.READABLE_RESULTS_FORMATS", frozenset({2}))
    with pytest.raises(EvalResultsError, match=r"results\.json: results format 1, this "
                                               r"release reads \[2\]; re-run the "
                                               r"evaluate_policy stage") as err:
        load_eval_result(path)
    assert exit_code_of(err.value) == 3
    monkeypatch.undo()
    data = json.loads(path.read_text())
    del data["systems"]["trained"]["summary"]  # a layout that moved a field: no KeyError
    path.write_text(json.dumps(data))
    with pytest.raises(EvalResultsError, match="not evaluation results this release reads"):
        load_eval_result(path)


def test_the_champions_gold_digest_is_compared_only_in_its_own_format(
        formats: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    work = formats / "work"
    found = reference_digest(work)
    assert found is not None and found[0] == "champion"
    same = GoldDigest()  # this week's data: the fixture's own question and corpus
    same.add_qa("train", [QAExample(id="q1", question="Where was Ailen Dour born?",
                                    golden_answers=("Vormak",))])
    corpus = work / "validate_gold_labels" / "corpus.jsonl"
    same.corpus("main").add([Passage(**json.loads(line)) for line in corpus.open()])
    drift = compare(same, *found, warn_fraction=0.1)
    assert [(s.name, s.added, s.removed, s.changed) for s in drift.sets] == \
        [("train", 0, 0, 0), ("main", 0, 0, 0)]
    # Hashed another way by a later release: not compared (every row would read "changed").
    monkeypatch.setattr(drift_module, "DIGEST_FORMAT", 2)
    assert reference_digest(work) is None
    assert "gold digest format 1, this release compares 2" in caplog.text


# --- index components and the embedding cache: recomputed in another format


def test_an_index_of_this_release_is_reused_and_rebuilt_after_a_format_change(
        formats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = formats / "work" / "validate_gold_labels" / "corpus.jsonl"
    index = formats / "index"
    reused = build_index(corpus, index, BM25_ONLY, None, NullSink(), progress=False)
    assert all(reused.components.values())  # the fixture's components, reused as they are
    assert load_searcher(index, BM25_ONLY).search_batch(["painter"], 1)[0][0].doc_id == "d3"
    monkeypatch.setattr(index_store, "FORMAT_VERSION", 2)
    with pytest.raises(IndexStoreError, match=r"index format 1, this release reads 2; "
                                              r"rebuild it"):
        load_searcher(index, BM25_ONLY)
    rebuilt = build_index(corpus, index, BM25_ONLY, None, NullSink(), progress=False)
    assert not any(rebuilt.components.values())  # every component built again
    assert json.loads((index / "manifest.json").read_text())["format"] == 2
    assert load_searcher(index, BM25_ONLY).search_batch(["painter"], 1)[0][0].doc_id == "d3"


def test_an_embedding_cache_entry_is_reused_only_in_its_own_format(
        formats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = [json.loads(line) for line in
              (formats / "work" / "validate_gold_labels" / "corpus.jsonl").open()]
    hashes = text_hashes(p["contents"] for p in corpus)
    config = IndexConfig()  # the bundled encoder the fixture's cache entry was written for
    cache = EmbeddingCache(formats / "embedding_cache", config)
    files, rows = cache.table().lookup(hashes)
    assert (files >= 0).all()  # every passage's vector is found
    vectors = np.load(embedding._vectors_of(cache.table().paths[0]))
    assert vectors[rows[1]].tolist() == [4.0, 5.0, 6.0, 7.0]
    monkeypatch.setattr(embedding, "CACHE_FORMAT", embedding.CACHE_FORMAT + 1)
    later = EmbeddingCache(formats / "embedding_cache", config)
    assert later.dir != cache.dir
    assert (later.table().lookup(hashes)[0] == -1).all()  # nothing reused: embedded anew


# --- checkpoints: a code or format change starts afresh, never resumes old weights


def test_a_checkpoint_of_this_release_resumes_and_another_format_is_refused_by_name(
        formats: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpts = formats / "checkpoints"
    assert verify_checkpoint(ckpts / "step_000002")["step"] == 2
    key = (ckpts / "run_key.json").read_text()
    assert prepare_checkpoint_dir(ckpts, key, resume=True) == ckpts / "step_000002"
    monkeypatch.setattr(checkpoint, "FORMAT_VERSION", 2)
    with pytest.raises(CheckpointError, match=r"manifest\.json: format_version 1, this code "
                                              r"reads 2"):
        verify_checkpoint(ckpts / "step_000002")
    assert latest_checkpoint(ckpts) is None
    with pytest.raises(CheckpointError, match=r"no checkpoint passes verification.*"
                                              r"train\.resume=false"):
        prepare_checkpoint_dir(ckpts, key, resume=True)
    # A release that changed the format changed the trainer's code, so its run key differs:
    # the old checkpoints are moved aside as evidence and training starts at step 0.
    assert prepare_checkpoint_dir(ckpts, "the upgraded trainer's key", resume=True) is None
    assert [p.name.split("-")[0] for p in formats.glob("checkpoints.superseded-*")] == \
        ["checkpoints.superseded"]


def test_the_run_identity_covers_the_training_code_and_result_packages(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config: PipelineConfig = load_config("configs/tiny.yaml")
    questions = [QAExample(id="q1", question="Where was Ann born?", golden_answers=("Oslo",))]
    (tmp_path / "init").mkdir()

    def identity() -> str:  # the trainer passes its own code (train_grpo -> setup_trainer)
        from searchrl.codehash import code_fingerprint
        from searchrl.train.grpo.trainer import train_policy_run

        return run_identity(config, questions, tmp_path / "init", 1,
                            init_key_file=tmp_path / "key",
                            code=code_fingerprint(train_policy_run))

    base = identity()
    assert identity() == base
    # An upgrade of torch: another run, last week's checkpoints are not resumed.
    real = __import__("searchrl.codehash", fromlist=["package_versions"]).package_versions

    def upgraded(names: object = None) -> dict[str, str]:
        return real() | {"torch": "99.0"}

    monkeypatch.setattr("searchrl.codehash.package_versions", upgraded)
    assert identity() != base
    monkeypatch.undo()
    # An edit to the trainer's code (train/grpo/update.py, reached from train_policy_run).
    real_sha = __import__("searchrl.codehash", fromlist=["known_sha256"]).known_sha256

    def edited(path: Path) -> str:
        return "edited" if path.name == "update.py" and path.parent.name == "grpo" \
            else real_sha(path)

    monkeypatch.setattr("searchrl.codehash.known_sha256", edited)
    assert identity() != base


def test_an_edited_module_the_trainer_reaches_starts_training_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # End to end through the trainer, which computes its own code fingerprint: a trainer
    # that passed a constant would resume the old checkpoint after the edit.
    from searchrl import codehash
    from searchrl.train.grpo.trainer import train_grpo
    from tests.train_fixture import build_init_policy, fake_rollouts, tiny_config, train_examples

    init = build_init_policy(tmp_path / "init")
    config, examples, out = tiny_config(tmp_path), train_examples(), tmp_path / "out"

    def train(stop_after: int | None = None) -> int:
        result = train_grpo(config, examples, None, init, out,  # type: ignore[arg-type]
                            rollout_fn=fake_rollouts, progress=False, stop_after=stop_after)
        return result.resumed_from

    assert train(stop_after=2) == 0  # interrupted after step 2 (its checkpoint kept)
    assert train(stop_after=1) == 2  # the same code resumes it (the control), to step 3
    # Upgrade: train/grpo/update.py (the PPO update the trainer calls) is edited on disk.
    edited = tmp_path / "searchrl_upgraded" / "update.py"
    edited.parent.mkdir()
    real_update = codehash.module_file("searchrl.train.grpo.update")
    assert real_update is not None
    edited.write_text(real_update.read_text() + "\n# the upgrade's change\n")
    real_module_file = codehash.module_file
    monkeypatch.setattr(codehash, "module_file", lambda name: edited
                        if name == "searchrl.train.grpo.update" else real_module_file(name))
    assert train() == 0  # from step 0: last run's step-3 checkpoint is not resumed
    aside = list(out.glob("checkpoints.superseded-*"))
    assert len(aside) == 1 and (aside[0] / "step_000003").is_dir()  # kept as evidence
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_the_deepspeed_config_contents_key_the_train_stage_and_its_run_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from searchrl.stages import files_of
    from searchrl.types import IndexRef
    from tasks import _common
    from tasks.train import train_policy as train_task

    # The key itself, not its lookup in Prefect's result store (no Prefect server here).
    monkeypatch.setattr(_common, "usable_key", lambda base: base)

    ds_json = tmp_path / "zero.json"
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 0}}))
    config = load_config("configs/tiny.yaml", [f"run.work_dir={tmp_path / 'work'}",
                                               f"train.deepspeed_config={ds_json}"])
    questions = [QAExample(id="q1", question="Where was Ann born?", golden_answers=("Oslo",))]
    (tmp_path / "init").mkdir()
    split = tmp_path / "train.jsonl"
    split.write_text("{}\n")
    params = {"config": config, "curriculum": None, "tracking_uri": None,
              "parent_run_id": None,
              "dataset": DatasetRef(paths={"train": str(split)}, fingerprints={},
                                    corpus_path=str(split), corpus_fingerprint="",
                                    fingerprint="d", files=files_of(split)),
              "index": IndexRef(index_dir=str(tmp_path), fingerprint="i", retriever="bm25",
                                files=files_of(split))}
    context = SimpleNamespace(task=SimpleNamespace(fn=train_task.fn))

    def keys() -> tuple[str | None, str]:
        key_fn = train_task.cache_policy.cache_key_fn  # type: ignore[union-attr]
        return (key_fn(context, params),  # the train stage's cache key, as Prefect asks it
                run_identity(config, questions, tmp_path / "init", 1,
                             init_key_file=tmp_path / "key", code="the trainer's"))

    before = keys()
    assert before[0] is not None and keys() == before
    # Same path, other contents (ZeRO 2 and bf16): another stage result, another run.
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}))
    after = keys()
    assert after[0] != before[0] and after[1] != before[1]
    assert config.inputs_of("train_policy")["train"]["deepspeed_config"] == str(ds_json)
