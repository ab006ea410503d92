"""Retention's view of the registry and the experiment (searchrl/retention.py), on a
real MLflow sqlite store: the experiment is shared by every `run.name`, so one pipeline's
prune never deletes another's weeks or the runs behind any registered version that stays; a
registry that does not answer protects nothing, so nothing is pruned; a pinned stage run keeps
its week; a RUNNING run that never finished (SIGKILL) protects its week only for
`retention.running_stale_hours`."""

from __future__ import annotations

import time
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from searchrl.__main__ import main as cli
from searchrl.config import load_config
from searchrl.config.pipeline import PipelineConfig
from searchrl.retention import plan_prune
from searchrl.tracking import CHALLENGER, PARENT_TAG, TrackingError, promote
from tests.helpers import fresh_mlflow_uri

EXPERIMENT = "shared"  # one experiment, several pipelines (tracking.experiment's default)


def _overrides(tmp: Path, uri: str, pipeline: str, *extra: str) -> list[str]:
    return [f"run.name={pipeline}", f"run.work_dir={tmp / pipeline}",
            f"tracking.tracking_uri={uri}", f"tracking.experiment={EXPERIMENT}",
            "retention.keep_weeks=1", "retention.keep_challengers=0",
            "retention.prefect_expired_results=false", *extra]


def _config(tmp: Path, uri: str, pipeline: str, *extra: str) -> PipelineConfig:
    return load_config("configs/tiny.yaml", _overrides(tmp, uri, pipeline, *extra))


def _week(uri: str, tmp: Path, pipeline: str, *, go: bool, start_ms: int | None = None,
          status: str = "FINISHED") -> tuple[str, str, str]:
    """One week of `pipeline` as the flow leaves it: a parent run named after the pipeline, a
    gate run under it holding the policy, registered (challenger; champion on GO).
    Returns (parent run id, gate run id, version)."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    exp_id = exp.experiment_id if exp else client.create_experiment(
        EXPERIMENT, artifact_location=(tmp / "art").as_uri())
    parent = client.create_run(exp_id, run_name=pipeline, start_time=start_ms)
    gate = client.create_run(exp_id, run_name="decide_go_no_go", start_time=start_ms,
                             tags={PARENT_TAG: parent.info.run_id})
    policy = tmp / "policies" / f"{pipeline}-{parent.info.run_id}"
    policy.mkdir(parents=True)
    (policy / "model.safetensors").write_bytes(b"w" * 100)
    client.log_artifacts(gate.info.run_id, str(policy), "policy")
    model = f"searchrl-{pipeline}"
    try:
        client.get_registered_model(model)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(model)
    mv = client.create_model_version(model, f"{gate.info.artifact_uri}/policy",
                                      run_id=gate.info.run_id)
    client.set_registered_model_alias(model, CHALLENGER, str(mv.version))
    if go:
        promote(uri, model, str(mv.version))
    if status != "RUNNING":
        for run in (gate, parent):
            client.set_terminated(run.info.run_id, status)
    time.sleep(0.002)  # distinct start times: weeks in order
    return parent.info.run_id, gate.info.run_id, str(mv.version)


def _deleted_runs(config: PipelineConfig) -> set[str]:
    plan = plan_prune(config, config.tracking.tracking_uri)
    return {d.target for d in plan.deletions if d.kind == "mlflow run"}


def test_one_pipelines_prune_never_deletes_another_pipelines_weeks_or_registered_runs(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path / "store")
    a_parent, a_gate, _ = _week(uri, tmp_path, "a", go=True)  # A's champion
    b1 = _week(uri, tmp_path, "b", go=True)
    b2 = _week(uri, tmp_path, "b", go=False)
    b3 = _week(uri, tmp_path, "b", go=False)
    _week(uri, tmp_path, "b", go=False)
    # Someone registered B's week-3 policy under a model of their own: that run backs it.
    client = MlflowClient(tracking_uri=uri)
    client.create_registered_model("hand-picked")
    client.create_model_version("hand-picked",
                                f"{client.get_run(b3[1]).info.artifact_uri}/policy",
                                run_id=b3[1])
    plan = plan_prune(_config(tmp_path, uri, "b"), uri)
    deleted = {d.target for d in plan.deletions if d.kind == "mlflow run"}
    # B's week 2 (its version unaliased, older than the newest week) goes, nothing else.
    assert deleted == {b2[0], b2[1]}
    assert {d.target for d in plan.deletions if d.kind == "model version"} == {
        "searchrl-b v2", "searchrl-b v3"}
    # A's champion week, and the files its alias points at, are untouched.
    assert not {a_parent, a_gate} & deleted
    a_policy = str(Path(client.get_run(a_gate).info.artifact_uri.removeprefix("file://")))
    assert not any(p.startswith(a_policy) for d in plan.deletions for p in d.paths)
    assert b1[0] not in deleted and b3[0] not in deleted
    assert any(b3[0] in k and "holds hand-picked v1" in k for k in plan.kept)


def test_a_registry_that_does_not_answer_prunes_nothing_and_prune_exits_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    uri = fresh_mlflow_uri(tmp_path / "store")
    champion = _week(uri, tmp_path, "a", go=True)
    _week(uri, tmp_path, "a", go=False)
    _week(uri, tmp_path, "a", go=False)
    config = _config(tmp_path, uri, "a")
    assert champion[0] not in _deleted_runs(config)

    def unavailable(*args: object, **kwargs: object) -> object:
        raise mlflow.exceptions.MlflowException("registry backend unavailable")

    monkeypatch.setattr(MlflowClient, "search_model_versions", unavailable)
    with pytest.raises(TrackingError, match=r"registry .* did not answer.*deletes nothing"):
        plan_prune(config, uri)
    assert cli(["prune", "--config", "configs/tiny.yaml", *_overrides(tmp_path, uri, "a")]) == 7
    assert "did not answer" in capsys.readouterr().err
    monkeypatch.undo()
    assert len(client_runs(uri)) == 6  # nothing was deleted


def client_runs(uri: str) -> list[str]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None
    return [r.info.run_id for r in client.search_runs([exp.experiment_id])]


def test_a_pinned_stage_run_keeps_its_week(tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path / "store")
    old = _week(uri, tmp_path, "a", go=False)
    _week(uri, tmp_path, "a", go=False)
    assert {old[0], old[1]} <= _deleted_runs(_config(tmp_path, uri, "a"))
    for pinned in (old[0], old[1]):  # the parent run, or its stage run
        assert not {old[0], old[1]} & _deleted_runs(
            _config(tmp_path, uri, "a", f"retention.pinned=[{pinned}]"))


def test_a_running_run_that_never_finished_protects_its_week_only_while_fresh(
        tmp_path: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path / "store")
    now = int(time.time() * 1000)
    killed = _week(uri, tmp_path, "a", go=False, start_ms=now - 72 * 3600 * 1000,
                   status="RUNNING")  # SIGKILLed three days ago: never marked finished
    _week(uri, tmp_path, "a", go=False)
    _week(uri, tmp_path, "a", go=False)
    config = _config(tmp_path, uri, "a")  # running_stale_hours: 48
    assert {killed[0], killed[1]} <= _deleted_runs(config)
    assert not {killed[0], killed[1]} & _deleted_runs(
        _config(tmp_path, uri, "a", "retention.running_stale_hours=100"))
