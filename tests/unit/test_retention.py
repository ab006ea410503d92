"""Retention (searchrl/retention.py) on a real MLflow sqlite store and a work dir laid
out as the stages leave it: the dry run lists deletions and their bytes and touches nothing;
pruning keeps the champion, the previous champion, the newest challengers, the newest weeks
and the pinned, and a rollback and a download of the restored champion work afterwards; a
work dir in flight is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from searchrl.__main__ import main as cli
from searchrl.config import load_config
from searchrl.config.pipeline import PipelineConfig
from searchrl.datasets.io import content_sha256
from searchrl.retention import plan_prune, prune
from searchrl.tracking import (
    CHALLENGER,
    PARENT_TAG,
    download_registered_policy,
    promote,
    registered_policy,
    rollback,
)
from searchrl.train.grpo.checkpoint import FORMAT_VERSION

# ~25 s: a real MLflow sqlite store (creating it, five weeks, `mlflow gc`) is slow here.
pytestmark = pytest.mark.slow

NAME = "searchrl-tiny"
# week -> GO (promoted) or not; every week registers a challenger, as the gate does
WEEKS = [True, True, False, False, False]


def _config(tmp: Path, *extra: str) -> PipelineConfig:
    return load_config("configs/tiny.yaml", [
        f"run.work_dir={tmp / 'work'}", f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
        "retention.keep_weeks=2", "retention.keep_challengers=1",
        "retention.embedding_cache_max_bytes=2000", *extra])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five weeks in MLflow (parent + gate run, a policy per week registered) and a work dir
    with superseded training runs, an embedding cache and Prefect result records."""
    tmp = tmp_path_factory.mktemp("retention")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("searchrl-tiny", artifact_location=(tmp / "art").as_uri())
    client.create_registered_model(NAME)
    for week, go in enumerate(WEEKS, start=1):
        parent = client.create_run(exp, run_name="tiny")  # run.name: this pipeline's weeks
        gate = client.create_run(exp, tags={PARENT_TAG: parent.info.run_id})
        policy = tmp / f"policy{week}"
        policy.mkdir()
        (policy / "model.safetensors").write_bytes(bytes([week]) * 1000)
        (policy / "config.json").write_text(json.dumps({"week": week}))
        client.log_artifacts(gate.info.run_id, str(policy), "policy")
        source = f"{gate.info.artifact_uri}/policy"
        mv = client.create_model_version(NAME, source, run_id=gate.info.run_id,
                                         tags={"decision": "GO" if go else "NO-GO"})
        client.set_registered_model_alias(NAME, CHALLENGER, mv.version)
        if go:
            promote(uri, NAME, str(mv.version))
        for run in (gate, parent):
            client.set_terminated(run.info.run_id, "FINISHED")
        time.sleep(0.01)  # distinct start times: weeks in order
    train = tmp / "work" / "train_policy"
    for n in range(3):
        for step in (1, 2):
            ckpt = train / f"checkpoints.superseded-2026120{n + 1}T000000" / f"step_00000{step}"
            ckpt.mkdir(parents=True)
            (ckpt / "model.safetensors").write_bytes(b"w" * 100)
            (ckpt / "manifest.json").write_text(json.dumps({  # as save_checkpoint writes it
                "format_version": FORMAT_VERSION, "step": step,
                "files": {"model.safetensors": content_sha256(ckpt / "model.safetensors")}}))
    cache = tmp / "work" / "build_index" / "embedding_cache" / "abcd"
    cache.mkdir(parents=True)
    for n, name in enumerate(("old", "mid", "new")):
        np.save(cache / f"shard-{name}.vectors.npy", np.zeros((8, 16), np.float32))
        np.save(cache / f"shard-{name}.hashes.npy", np.zeros(8, np.uint64))
        os.utime(cache / f"shard-{name}.hashes.npy", (1e9 + n, 1e9 + n))
    results = tmp / "prefect-results"
    results.mkdir()
    for name, days in (("expired", -1), ("fresh", 30)):
        when = (datetime.now(UTC) + timedelta(days=days)).isoformat()
        (results / name).write_text(json.dumps({"metadata": {"expiration": when},
                                                "result": "x"}))
    return tmp


def _versions(uri: str) -> list[str]:
    return sorted(str(v.version) for v in
                  MlflowClient(tracking_uri=uri).search_model_versions(f"name = '{NAME}'"))


def _snapshot(tmp: Path) -> list[str]:
    # (the training lock's file aside: taking the lock creates it, as training does)
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.suffix != ".lock")


def test_dry_run_lists_every_deletion_with_its_bytes_and_deletes_nothing(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(store)
    before = _snapshot(store)
    plan = plan_prune(config, config.tracking.tracking_uri,
                      prefect_storage=store / "prefect-results")
    kinds = sorted((d.kind, Path(d.target).name) for d in plan.deletions
                   if d.kind != "mlflow run")
    assert kinds == [("checkpoint", "step_000001"), ("checkpoint", "step_000001"),
                     ("embedding shard", "shard-old"), ("model version", f"{NAME} v3"),
                     ("model version", f"{NAME} v4"), ("prefect result", "expired"),
                     ("superseded run", "checkpoints.superseded-20261201T000000")]
    # Week 3 (v3, no alias) is the only week outside the newest two that holds no kept version.
    runs = [d for d in plan.deletions if d.kind == "mlflow run"]
    assert len(runs) == 2 and all("week older than the newest 2" in d.why for d in runs)
    # Bytes once each: a deleted version's policy counts with the version, not its run.
    assert all(d.bytes > 0 for d in plan.deletions if d.kind != "mlflow run")
    assert plan.bytes == sum(d.bytes for d in plan.deletions)
    assert any("v1 (alias previous-champion)" in k for k in plan.kept)
    assert any("v2 (alias champion)" in k for k in plan.kept)

    assert cli(["prune", "--dry-run", "--config", "configs/tiny.yaml",
                f"run.work_dir={store / 'work'}",
                f"tracking.tracking_uri=sqlite:///{store / 'mlflow.db'}",
                "retention.keep_weeks=2", "retention.keep_challengers=1",
                "retention.embedding_cache_max_bytes=2000"]) == 0
    out = capsys.readouterr().out
    assert f"would delete model version {NAME} v3" in out
    assert "retention: would delete" in out.splitlines()[-1]
    assert _snapshot(store) == before
    assert _versions(config.tracking.tracking_uri or "") == ["1", "2", "3", "4", "5"]


def test_a_work_dir_in_flight_is_left_alone(store: Path) -> None:
    config = _config(store)
    lock = store / "work" / "train_policy" / "checkpoints.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        plan = prune(config, config.tracking.tracking_uri, dry_run=True)
    finally:
        holder.kill()
        holder.wait()
    assert not [d for d in plan.deletions if d.kind in ("checkpoint", "superseded run",
                                                        "embedding shard")]
    assert plan.skipped and "in flight" in plan.skipped[0]
    # A pinned version stays with its week.
    pinned = plan_prune(_config(store, "retention.pinned=[v3]"), config.tracking.tracking_uri)
    assert f"{NAME} v3" not in {d.target for d in pinned.deletions}


def test_prune_then_rollback_then_the_restored_champion_downloads(store: Path) -> None:
    config = _config(store)
    uri = config.tracking.tracking_uri or ""
    plan = prune(config, uri, prefect_storage=store / "prefect-results")
    assert _versions(uri) == ["1", "2", "5"]
    client = MlflowClient(tracking_uri=uri)
    for d in plan.deletions:
        if d.kind == "mlflow run":  # purged from the store by mlflow gc, artifacts included
            with pytest.raises(Exception, match=r"not found|No Run"):
                client.get_run(d.target)
        for path in d.paths:
            assert not Path(path).exists(), path
    train = store / "work" / "train_policy"
    assert sorted(p.name for p in train.glob("checkpoints.superseded-*")) == [
        "checkpoints.superseded-20261202T000000", "checkpoints.superseded-20261203T000000"]
    assert all([s.name for s in d.glob("step_*")] == ["step_000002"]
               for d in train.glob("checkpoints.superseded-*"))
    cache = store / "work" / "build_index" / "embedding_cache" / "abcd"
    assert sorted(p.name for p in cache.glob("*.hashes.npy")) == [
        "shard-mid.hashes.npy", "shard-new.hashes.npy"]
    assert [p.name for p in (store / "prefect-results").iterdir()] == ["fresh"]
    # What a rollback and the next evaluation need is all there.
    done = rollback(uri, NAME, "retention test: back to the previous champion")
    assert (done["from_version"], done["to_version"]) == ("2", "1")
    restored = download_registered_policy(uri, NAME, "champion", store / "champion")
    assert restored is not None
    assert json.loads((restored / "config.json").read_text()) == {"week": 1}
    # The next prune: the rolled-back v2 lost its alias and goes; the champion (v1) stays,
    # and the work dir has nothing more to give.
    again = prune(config, uri, prefect_storage=store / "prefect-results")
    assert {d.kind for d in again.deletions} <= {"model version", "mlflow run"}
    assert _versions(uri) == ["1", "5"]
    assert registered_policy(uri, NAME, "champion")["version"] == "1"  # type: ignore[index]
