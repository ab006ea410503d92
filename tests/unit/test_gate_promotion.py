"""Promotion that never makes things worse: the gate stage registers every candidate as
`challenger` (tagged with its decision, figures and data fingerprints), a GO that is not worse
than the current champion moves `champion` (keeping `previous-champion`), and
`python -m searchrl rollback` restores the previous one with a recorded reason. And
train.init=champion: training starts from the downloaded champion, whose version is in the
train stage's cache key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlflow
import pytest
import yaml
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file, save_file

from searchrl.__main__ import main
from searchrl.config import PipelineConfig
from searchrl.datasets.io import write_jsonl
from searchrl.eval.baselines import TRAINED
from searchrl.eval.results import RESULTS_FILE
from searchrl.stages import STAGES, StageInputError, decide_go_no_go
from searchrl.tracking import (
    CHALLENGER,
    PREVIOUS,
    PREVIOUS_TAG,
    PROMOTION_INTENT_TAG,
    STATE_TAG,
    WEIGHTS_TAG,
    MlflowSink,
    TrackingError,
    download_registered_policy,
    log_policy_model,
    model_version_tags,
    registered_policy,
    rollback,
    start_parent_run,
    weights_digest,
)
from searchrl.train.start import fetch_champion_start
from searchrl.types import CheckpointRef, DatasetRef, EvalRef
from searchrl.validation.drift import history_dir
from tests.helpers import fresh_mlflow_uri, registry_fails_at, save_tiny_policy
from tests.unit.test_gate_report import _eval

GATE = {"gpu_price_per_hour": 2.0, "production_queries_per_month": 100_000,
        "min_gold_pairs": 100, "max_payback_months": 6.0, "min_accuracy_margin": 0.05,
        "allow_stand_in_comparator": True, "comparison_baseline": "retrieve_once"}


def _config(tmp: Path, uri: str, **train: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"name": "world-b", "work_dir": str(tmp / "work")},
        "tracking": {"tracking_uri": uri}, "gate": GATE, "train": train})


def trained_variant(policy: Path, out: Path, offset: float) -> Path:
    """A copy of `policy` with other weights (`offset` added to one tensor): another trained
    candidate. The same offset gives the same weights."""
    shutil.copytree(policy, out)
    weights = load_file(out / "model.safetensors")
    first = sorted(weights)[0]
    weights[first] = weights[first] + offset
    save_file(weights, out / "model.safetensors")
    return out


def _gate(tmp: Path, config: PipelineConfig, uri: str, policy: Path,
          accs: dict[str, float], tag: str, weights: str | None = None,
          trained_run: str | None = None) -> MlflowSink:
    """One gate run on a candidate with its own weights (those of candidate `weights` when
    given: the same policy again), trained in MLflow run `trained_run` when given."""
    sub = tmp / tag
    sub.mkdir()
    policy = trained_variant(policy, sub / "policy", float(ord((weights or tag)[0])))
    results = sub / RESULTS_FILE
    results.write_text(json.dumps(_eval(sub, accs).to_dict()))
    train = sub / "train.jsonl"
    write_jsonl(train, [{"q": i} for i in range(150)])
    digest = sub / "gold_digest"  # what validation leaves for the drift report
    digest.mkdir()
    (digest / "meta.json").write_text(json.dumps({"run": tag}))
    dataset = DatasetRef(paths={"train": str(train)}, fingerprints={"train": "fp-train"},
                         corpus_path="", corpus_fingerprint="fp-corpus", fingerprint="x",
                         digest_dir=str(digest))
    ckpt = CheckpointRef(policy_dir=str(policy), fingerprint=f"policy-{tag}",
                         training_seconds=36.0, mlflow_run_id=trained_run)
    sink = start_parent_run(uri, "exp", f"gate-{tag}", {})
    decide_go_no_go(config, dataset, None, ckpt,
                    EvalRef(results_path=str(results), fingerprint=f"eval-{tag}"), sink)
    return sink


def _champion_digest(config: PipelineConfig) -> str | None:
    """Whose gold-set digest the next drift report compares with (kept by the gate on GO)."""
    meta = history_dir(config.run.work_dir) / "champion" / "meta.json"
    return json.loads(meta.read_text())["run"] if meta.is_file() else None


def _alias(uri: str, alias: str) -> str | None:
    found = registered_policy(uri, "searchrl-world-b", alias)
    return found["version"] if found else None


def test_candidates_are_challengers_a_go_never_replaces_a_stronger_champion_and_rollback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    # 1. No champion yet: GO, the registry model is named after the pipeline.
    _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    assert (_alias(uri, CHALLENGER), _alias(uri, "champion"), _alias(uri, PREVIOUS)) == \
        ("1", "1", None)
    assert _champion_digest(config) == "a"
    tags = model_version_tags(uri, "searchrl-world-b", "1")
    assert tags["decision"] == "GO" and tags["data.train"] == "fp-train"
    assert tags["data.corpus"] == "fp-corpus" and tags["policy_fingerprint"] == "policy-a"
    assert tags["eval_fingerprint"] == "eval-a" and float(tags["figure.em_trained"]) == 0.6
    # 2. Far above the comparator but worse than the champion: registered, not promoted.
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.8, TRAINED: 0.6}, "b")
    assert (_alias(uri, CHALLENGER), _alias(uri, "champion")) == ("2", "1")
    assert model_version_tags(uri, "searchrl-world-b", "2")["decision"] == "NO-GO"
    assert _champion_digest(config) == "a"  # a NO-GO leaves the champion's gold set alone
    decision = json.loads((tmp_path / "work" / "decide_go_no_go" / "decision.json").read_text())
    failed = [c for c in decision["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["champion"] and "version 1" in failed[0]["detail"]
    # 3. As good as the champion: GO, the champion it replaces is kept.
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.6}, "c")
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("3", "1")
    assert _champion_digest(config) == "c"
    # 4. Rollback from the CLI: champion back to 1, the reason recorded.
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config.to_dict()))
    assert main(["rollback", "--config", str(cfg)]) == 2  # a reason is required
    assert main(["rollback", "--config", str(cfg), "--reason", "wrong answers on live"]) == 0
    assert json.loads(capsys.readouterr().out)["to_version"] == "1"
    assert _alias(uri, "champion") == "1" and _alias(uri, PREVIOUS) is None
    assert model_version_tags(uri, "searchrl-world-b", "3")["rolled_back_reason"] == \
        "wrong answers on live"
    assert main(["rollback", "--config", str(cfg), "--reason", "again"]) == 11


def test_train_init_champion_downloads_it_and_keys_the_stage_on_its_version(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri, init="champion")
    out = tmp_path / "train"
    out.mkdir()
    key = STAGES["train_policy"].external_inputs
    assert key is not None
    assert key(config) == "champion:searchrl-world-b:none"
    assert key(_config(tmp_path, uri)) == "init:base"
    with pytest.raises(StageInputError, match="no searchrl-world-b@champion"):
        fetch_champion_start(config, out, uri)
    pointer = out / "champion_start.json"  # where the download is recorded
    assert not pointer.exists()
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    _gate(tmp_path, _config(tmp_path, uri), uri, policy,
          {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    assert key(config) == "champion:searchrl-world-b:1"
    got = fetch_champion_start(config, out, uri)
    assert got is not None and json.loads(pointer.read_text())["dir"] == str(got)
    assert (got / "config.json").is_file() and (got / "tokenizer.json").is_file()
    assert json.loads((got / "searchrl_sft.json").read_text())["version"] == "1"
    assert fetch_champion_start(_config(tmp_path, uri), out, uri) is None
    assert not pointer.exists()


def test_train_init_champion_records_the_version_it_downloaded_when_the_alias_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The champion is looked up once: promoting another version while its weights download
    does not record that other version beside them (the start's identity for resuming)."""
    import mlflow.artifacts
    from torch import equal as torch_equal

    from searchrl.tracking import promote, register_policy

    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri, init="champion")
    name = config.registry_model_name
    first = save_tiny_policy(["who is the mayor of paris"], tmp_path / "first")
    second = trained_variant(first, tmp_path / "second", 0.5)
    for policy, alias in ((first, "champion"), (second, CHALLENGER)):  # versions 1 and 2
        register_policy(uri, start_parent_run(uri, "exp", "gate", {}).run_id, policy, name,
                        alias)
    download = mlflow.artifacts.download_artifacts

    def promoted_meanwhile(*args: object, **kwargs: object) -> str:
        promote(uri, name, "2")
        return download(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", promoted_meanwhile)
    got = fetch_champion_start(config, tmp_path / "train", uri)
    assert got is not None and (registered_policy(uri, name, "champion") or {}) \
        .get("version") == "2"
    assert json.loads((got / "searchrl_sft.json").read_text())["version"] == "1"
    downloaded = load_file(got / "model.safetensors")
    for source, same in ((first, True), (second, False)):
        weights = load_file(source / "model.safetensors")
        assert all(torch_equal(weights[k], downloaded[k]) for k in weights) is same


def _report_notes(tmp: Path) -> str:
    decision = json.loads((tmp / "work" / "decide_go_no_go" / "decision.json").read_text())
    md = (tmp / "work" / "decide_go_no_go" / "report.md").read_text()
    return "\n".join(decision["notes"]) + "\n" + md


def test_a_rollback_survives_the_next_runs_and_a_retried_rollback_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    good = {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.6}
    _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    _gate(tmp_path, config, uri, policy, good, "b")
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("2", "1")
    # A re-run after the GO (same trained weights): the champion's own policy is not
    # registered again, and the real previous champion stays.
    _gate(tmp_path, config, uri, policy, good, "b-rerun", weights="b")
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS), _alias(uri, CHALLENGER)) == \
        ("2", "1", "2")
    assert "weights are the champion's (registered version 2)" in _report_notes(tmp_path)
    tags = model_version_tags(uri, "searchrl-world-b", "2")
    assert tags["last_decision"] == "GO" and tags["last_gate_run_id"] != tags["gate_run_id"]
    assert tags["eval_fingerprint"] == "eval-b"  # its own registration's record, as it was
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config.to_dict()))
    assert main(["rollback", "--config", str(cfg), "--reason", "wrong on live"]) == 0
    capsys.readouterr()
    assert _alias(uri, "champion") == "1"
    # Retried: a plain rollback refuses to go one generation further; --to is idempotent.
    assert main(["rollback", "--config", str(cfg), "--reason", "wrong on live"]) == 11
    assert "restored by a rollback" in capsys.readouterr().err
    assert main(["rollback", "--config", str(cfg), "--reason", "wrong on live",
                 "--to", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["already"] == "true"
    assert _alias(uri, "champion") == "1"
    # Next Monday: the same trained policy (training reused), GO against the restored
    # champion: not promoted again, and the report says why.
    _gate(tmp_path, config, uri, policy, good, "monday", weights="b")
    assert (_alias(uri, "champion"), _alias(uri, CHALLENGER)) == ("1", "2")
    notes = _report_notes(tmp_path)
    assert "registered version 2's, rolled back at" in notes and "rollback --to 2" in notes
    assert _champion_digest(config) == "b"  # the blocked GO keeps no new drift reference
    # A new policy that passes is promoted as usual, and can be rolled back plainly.
    _gate(tmp_path, config, uri, policy, good, "c")
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("3", "1")
    assert main(["rollback", "--config", str(cfg), "--reason", "again wrong"]) == 0
    assert _alias(uri, "champion") == "1"
    # Restoring a rolled-back version on purpose: --to names it.
    assert main(["rollback", "--config", str(cfg), "--reason", "fixed upstream",
                 "--to", "2"]) == 0
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("2", "1")


def test_a_promotions_freeze_decides_registers_and_reports_but_never_promotes(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    frozen = _config(tmp_path, uri).model_copy(update={"gate": _config(
        tmp_path, uri).gate.model_copy(update={"freeze_promotions": True})})
    sink = _gate(tmp_path, frozen, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    decision = json.loads((tmp_path / "work" / "decide_go_no_go" / "decision.json").read_text())
    assert decision["go"] is True  # decided as usual
    assert (_alias(uri, CHALLENGER), _alias(uri, "champion")) == ("1", None)
    assert "Promotions are frozen (gate.freeze_promotions)" in _report_notes(tmp_path)
    tags = sink.client.get_run(sink.run_id).data.tags
    assert "frozen" in tags["promotion_blocked"] and "promoted_to" not in tags
    assert _champion_digest(frozen) is None
    # The freeze is a gate input: lifting it re-runs the gate (its cache key changes).
    assert frozen.inputs_of("decide_go_no_go") != _config(tmp_path, uri).inputs_of(
        "decide_go_no_go")


def test_a_candidate_is_stored_once_as_the_model_its_training_run_logged(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    candidate = trained_variant(policy, tmp_path / "candidate", float(ord("a")))
    trained = start_parent_run(uri, "exp", "train_policy", {})
    log_policy_model(uri, trained.run_id, candidate)  # what the train stage logs, once
    gate = _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a",
                 trained_run=trained.run_id)
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version("searchrl-world-b", "1")
    assert version.run_id == trained.run_id
    assert version.source.startswith(client.get_run(trained.run_id).info.artifact_uri)
    assert client.list_artifacts(gate.run_id, "policy") == []  # not logged a second time
    got = download_registered_policy(uri, "searchrl-world-b", "champion", tmp_path / "dl")
    assert got is not None
    ours, theirs = load_file(candidate / "model.safetensors"), load_file(
        got / "model.safetensors")
    assert set(ours) == set(theirs) and all((ours[k] == theirs[k]).all() for k in ours)
    assert version.tags[WEIGHTS_TAG] == weights_digest(candidate)


def test_a_rerun_of_the_champion_leaves_the_challenger_on_the_newest_other_candidate(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.8, TRAINED: 0.6}, "b")  # NO-GO
    assert (_alias(uri, "champion"), _alias(uri, CHALLENGER)) == ("1", "2")
    # A re-run that trains the champion's weights again: the candidate is version 1, which
    # the champion alias protects; version 2 keeps `challenger` (and retention's protection).
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.6}, "a-rerun", weights="a")
    assert (_alias(uri, "champion"), _alias(uri, CHALLENGER)) == ("1", "2")
    assert model_version_tags(uri, "searchrl-world-b", "1")["last_decision"] == "GO"


def test_a_champion_registered_before_weights_sha256_is_recognised_by_a_rerun(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    client = MlflowClient(tracking_uri=uri)
    digest = model_version_tags(uri, "searchrl-world-b", "1")[WEIGHTS_TAG]
    client.delete_model_version_tag("searchrl-world-b", "1", WEIGHTS_TAG)  # as registered
    # before the stamp. The first re-run after the upgrade: the champion, not a new version.
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.6}, "a-rerun", weights="a")
    assert [v.version for v in client.search_model_versions("name = 'searchrl-world-b'")] == [1]
    assert "weights are the champion's (registered version 1)" in _report_notes(tmp_path)
    assert model_version_tags(uri, "searchrl-world-b", "1")[WEIGHTS_TAG] == digest  # stamped


def _registry(uri: str) -> dict[str, Any]:
    """Aliases, and each version's decision and promotion record (provenance tags such as
    run ids and fingerprints name the gate run that registered it, and differ)."""
    client = MlflowClient(tracking_uri=uri)
    model = client.get_registered_model("searchrl-world-b")
    kept = ("decision", STATE_TAG, PREVIOUS_TAG, WEIGHTS_TAG)
    return {"aliases": {k: str(v) for k, v in model.aliases.items()},
            "model": dict(model.tags),
            "versions": {str(v.version): {k: v.tags.get(k) for k in kept}
                         | {"promoted": "promoted_at" in v.tags}
                         for v in client.search_model_versions("name = 'searchrl-world-b'")}}


def _go_over_champion(tmp: Path, policy: Path, fail_at: int | None) -> tuple[str, list[str]]:
    """Champion version 1 (gate a), then gate b's GO with the store failing at registry write
    `fail_at` (None: never), then gate b again on the same weights (the scheduler's retry).
    Returns the store and the writes gate b's first run made."""
    uri = fresh_mlflow_uri(tmp)
    config = _config(tmp, uri)
    _gate(tmp, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    accs = {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.7}
    with registry_fails_at(fail_at) as made:
        if fail_at is None:
            _gate(tmp, config, uri, policy, accs, "b")
        else:
            with pytest.raises((TrackingError, mlflow.exceptions.MlflowException),
                               match="injected"):
                _gate(tmp, config, uri, policy, accs, "b")
    _gate(tmp, config, uri, policy, accs, "b-retry", weights="b")
    return uri, made


def test_a_promotion_interrupted_at_any_write_is_finished_by_the_retried_gate(
        tmp_path: Path) -> None:
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    reference, writes = _go_over_champion(tmp_path / "reference", policy, None)
    expected = _registry(reference)
    assert expected["aliases"] == {"champion": "2", PREVIOUS: "1", CHALLENGER: "2"}
    assert expected["versions"]["2"][PREVIOUS_TAG] == "1"
    assert expected["versions"]["2"]["promoted"] and PROMOTION_INTENT_TAG not in \
        expected["model"]
    assert len(writes) >= 6
    for k in range(1, len(writes) + 1):
        uri, _ = _go_over_champion(tmp_path / f"fails-at-{k}", policy, k)
        assert _registry(uri) == expected, f"interrupted at write {k}: {writes[k - 1]}"
        # The champion's gold set is the promoted candidate's, as without the interruption.
        assert _champion_digest(_config(tmp_path / f"fails-at-{k}", uri)) == "b-retry", k


def test_a_rollback_after_an_interrupted_promotion_finishes_it_then_rolls_it_back(
        tmp_path: Path) -> None:
    """Between the interruption and the retry an operator rolls back: the promotion the gate
    decided is finished first (never a previous-champion equal to the champion), then undone."""
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    _, writes = _go_over_champion(tmp_path / "count", policy, None)
    alias_moves = [k for k, w in enumerate(writes, 1) if w == "set_registered_model_alias"]
    uri = fresh_mlflow_uri(tmp_path / "store")
    config = _config(tmp_path / "store", uri)
    _gate(tmp_path / "store", config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    with pytest.MonkeyPatch.context() as patch:
        real = MlflowClient.set_registered_model_alias
        seen: list[str] = []

        def alias(self: MlflowClient, name: str, alias: str, version: str) -> None:
            seen.append(alias)
            if alias == "champion":  # the store goes away as the champion is to move
                raise mlflow.exceptions.MlflowException("injected: alias failed")
            real(self, name, alias, version)

        patch.setattr(MlflowClient, "set_registered_model_alias", alias)
        with pytest.raises(TrackingError, match=r"promotion stopped .*re-run the gate"):
            _gate(tmp_path / "store", config, uri, policy,
                  {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.7}, "b")
    assert len(alias_moves) >= 2 and seen[-2:] == [PREVIOUS, "champion"]
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("1", "1")  # mid-promotion
    done = rollback(uri, "searchrl-world-b", "bad answers")
    assert (done["from_version"], done["to_version"]) == ("2", "1")
    assert _alias(uri, "champion") == "1" and _alias(uri, PREVIOUS) is None
    tags = model_version_tags(uri, "searchrl-world-b", "2")
    assert tags[STATE_TAG] == "rolled_back" and tags["rolled_back_reason"] == "bad answers"
