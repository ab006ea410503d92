"""The model registry: every candidate registered as `challenger`, a GO promoted to `champion`
keeping `previous-champion`, `rollback` restoring it with a reason, and the registered policy
loadable as an MLflow transformers model (`models:/<name>@champion`) that generates."""

from __future__ import annotations

import socket
from pathlib import Path

import mlflow.transformers
import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from searchrl.tracking import (
    CHALLENGER,
    FORMAT_TAG,
    POLICY_FORMAT,
    PREVIOUS,
    WEIGHTS_TAG,
    RegistryError,
    TrackingError,
    download_registered_policy,
    logged_policy_model,
    model_version_tags,
    promote,
    register_policy,
    registered_policy,
    rollback,
    start_parent_run,
    version_with_weights,
    weights_digest,
)
from tests.helpers import fresh_mlflow_uri, save_tiny_policy

TEXTS = ["who is the mayor of paris", "the city of lyon lies in france"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(TEXTS, tmp_path_factory.mktemp("policy"))


def test_registered_alias_loads_through_mlflow_and_generates(tmp_path: Path,
                                                             policy: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    assert registered_policy(uri, "policy-x", "champion") is None
    assert download_registered_policy(uri, "policy-x", "champion", tmp_path / "dl") is None
    run = start_parent_run(uri, "exp", "gate", {})
    assert register_policy(uri, run.run_id, policy, "policy-x", "champion",
                           tags={"decision": "GO"}) == "1"
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        pipe = mlflow.transformers.load_model("models:/policy-x@champion")
    finally:
        mlflow.set_tracking_uri(before)
    out = pipe("who is the", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("who is the")
    assert len(pipe.tokenizer(out[0]["generated_text"])["input_ids"]) > \
        len(pipe.tokenizer("who is the")["input_ids"])
    # The evaluation's champion baseline: one save_pretrained dir, same weights; an earlier
    # champion's files in the folder are gone (a fresh directory, published whole).
    stale = [tmp_path / "dl" / "adapter_config.json",
             tmp_path / "dl" / "model" / "pytorch_model.bin"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("an earlier champion")
    got = download_registered_policy(uri, "policy-x", "champion", tmp_path / "dl")
    assert got is not None and (got / "config.json").is_file()
    assert not any(path.exists() for path in stale)
    assert got.is_relative_to(tmp_path / "dl") and not list(tmp_path.glob(".dl.*"))
    assert (got / "tokenizer.json").is_file()
    ours, theirs = load_file(policy / "model.safetensors"), load_file(got / "model.safetensors")
    assert set(ours) == set(theirs) and all((ours[k] == theirs[k]).all() for k in ours)
    tags = model_version_tags(uri, "policy-x", "1")
    assert tags["decision"] == "GO" and tags[FORMAT_TAG] == str(POLICY_FORMAT)
    assert tags[WEIGHTS_TAG] == weights_digest(policy)


def test_promotion_keeps_previous_champion_and_rollback_restores_it(tmp_path: Path,
                                                                   policy: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    run = start_parent_run(uri, "exp", "gate", {})
    v1 = register_policy(uri, run.run_id, policy, "m", CHALLENGER)
    assert promote(uri, "m", v1) is None  # the first champion replaces nothing
    assert registered_policy(uri, "m", PREVIOUS) is None
    with pytest.raises(RegistryError, match="no 'previous-champion'"):
        rollback(uri, "m", "bad answers in prod")
    v2 = register_policy(uri, run.run_id, policy, "m", CHALLENGER)  # a NO-GO: not promoted
    assert registered_policy(uri, "m", "champion")["version"] == v1  # type: ignore[index]
    assert registered_policy(uri, "m", CHALLENGER)["version"] == v2  # type: ignore[index]
    v3 = register_policy(uri, run.run_id, policy, "m", CHALLENGER)
    assert promote(uri, "m", v3) == v1
    assert registered_policy(uri, "m", "champion")["version"] == v3  # type: ignore[index]
    assert registered_policy(uri, "m", PREVIOUS)["version"] == v1  # type: ignore[index]
    with pytest.raises(RegistryError, match="reason"):
        rollback(uri, "m", "  ")
    done = rollback(uri, "m", "regression on live traffic")
    assert (done["from_version"], done["to_version"]) == (v3, v1)
    assert registered_policy(uri, "m", "champion")["version"] == v1  # type: ignore[index]
    assert registered_policy(uri, "m", PREVIOUS) is None  # v1 replaced nothing
    assert model_version_tags(uri, "m", v3)["rolled_back_reason"] == \
        "regression on live traffic"
    assert model_version_tags(uri, "m", v1)["restored_reason"] == "regression on live traffic"
    model = MlflowClient(tracking_uri=uri).get_registered_model("m")
    assert "regression on live traffic" in model.tags["last_rollback"]


def test_a_version_in_a_policy_format_this_release_does_not_read_is_refused_by_name(
        tmp_path: Path, policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    run = start_parent_run(uri, "exp", "gate", {})
    client = MlflowClient(tracking_uri=uri)
    client.log_artifacts(run.run_id, str(policy), "policy")  # a save_pretrained dir
    client.create_registered_model("m")
    source = f"{client.get_run(run.run_id).info.artifact_uri}/policy"
    version = client.create_model_version("m", source, run_id=run.run_id,
                                          tags={FORMAT_TAG: str(POLICY_FORMAT)}).version
    client.set_registered_model_alias("m", "champion", str(version))
    assert download_registered_policy(uri, "m", "champion", tmp_path / "dl") is not None
    # A later release that changed the layout: named, with what to do; nothing downloaded.
    monkeypatch.setattr("searchrl.tracking.READABLE_POLICY_FORMATS",
                        frozenset({POLICY_FORMAT + 1}))
    with pytest.raises(RegistryError, match=rf"'m' version {version}: policy format "
                                            r"'1'.*rollback --to VERSION"):
        download_registered_policy(uri, "m", "champion", tmp_path / "later")
    assert not (tmp_path / "later").exists()
    with pytest.raises(RegistryError, match="policy format"):
        rollback(uri, "m", "restore it", to_version=str(version))
    # Registered before the stamp existed: read as before.
    monkeypatch.undo()
    client.delete_model_version_tag("m", str(version), FORMAT_TAG)
    got = download_registered_policy(uri, "m", "champion", tmp_path / "old")
    assert got is not None and (got / "config.json").is_file()


def test_a_registry_that_does_not_answer_is_never_read_as_no_champion(
        tmp_path: Path, policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Absent is None; unanswered is TrackingError. Read as "no champion", a store's hiccup
    at evaluation would drop the champion from the comparison and let the gate promote
    without it; read as "no version holds these weights", the champion would be registered
    again."""
    uri = fresh_mlflow_uri(tmp_path)
    run = start_parent_run(uri, "exp", "gate", {})
    register_policy(uri, run.run_id, policy, "policy-x", CHALLENGER)
    assert registered_policy(uri, "policy-x", "champion") is None  # the model, not the alias
    assert version_with_weights(uri, "policy-y", weights_digest(policy), policy) is None
    assert logged_policy_model(uri, run.run_id) is not None
    # An MLflow server that does not answer: nothing listens on its port.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(TrackingError, match=r"policy-x.*did not answer for alias 'champion'"):
        registered_policy(dead, "policy-x", "champion")
    with pytest.raises(TrackingError, match="did not answer"):
        download_registered_policy(dead, "policy-x", "champion", tmp_path / "dl")
    assert not (tmp_path / "dl").exists()
    with pytest.raises(TrackingError, match=r"policy-x.*did not answer which versions"):
        version_with_weights(dead, "policy-x", weights_digest(policy), policy)
    with pytest.raises(TrackingError, match="did not answer whether it logged a policy"):
        logged_policy_model(dead, run.run_id)
