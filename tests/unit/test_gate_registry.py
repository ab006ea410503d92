"""Registering a GO policy in the MLflow model registry and finding the champion again."""

from __future__ import annotations

from pathlib import Path

from searchrl.tracking import (
    download_registered_policy,
    register_policy,
    registered_policy,
    start_parent_run,
)


def test_register_alias_and_download_round_trip(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert registered_policy(uri, "policy-x", "champion") is None
    assert download_registered_policy(uri, "policy-x", "champion", tmp_path / "dl") is None
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text('{"v": 1}')
    run = start_parent_run(uri, "exp", "gate", {})
    assert register_policy(uri, run.run_id, policy, "policy-x", "champion") == "1"
    (policy / "config.json").write_text('{"v": 2}')
    assert register_policy(uri, run.run_id, policy, "policy-x", "champion") == "2"
    found = registered_policy(uri, "policy-x", "champion")
    assert found is not None and found["version"] == "2" and found["run_id"] == run.run_id
    assert registered_policy(uri, "policy-x", "other-alias") is None
    got = download_registered_policy(uri, "policy-x", "champion", tmp_path / "dl")
    assert got is not None and (got / "config.json").read_text() == '{"v": 2}'
