"""The model registry: every candidate registered as `challenger`, a GO promoted to `champion`
keeping `previous-champion`, `rollback` restoring it with a reason, and the registered policy
loadable as an MLflow transformers model (`models:/<name>@champion`) that generates."""

from __future__ import annotations

from pathlib import Path

import mlflow.transformers
import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from searchrl.tracking import (
    CHALLENGER,
    PREVIOUS,
    RegistryError,
    download_registered_policy,
    model_version_tags,
    promote,
    register_policy,
    registered_policy,
    rollback,
    start_parent_run,
)
from tests.helpers import save_tiny_policy

TEXTS = ["who is the mayor of paris", "the city of lyon lies in france"]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(TEXTS, tmp_path_factory.mktemp("policy"))


def test_registered_alias_loads_through_mlflow_and_generates(tmp_path: Path,
                                                             policy: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
    assert model_version_tags(uri, "policy-x", "1")["decision"] == "GO"


def test_promotion_keeps_previous_champion_and_rollback_restores_it(tmp_path: Path,
                                                                   policy: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
