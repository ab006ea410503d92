"""Retention of the work dir and Prefect's result records (searchrl/retention.py),
without a tracking store: an odd result record is skipped with a warning and the rest are
still pruned; a superseded run keeps its newest checkpoint that verifies, half-written ones
go; the embedding cache is left alone while an index build (the flow's or the CLI's) holds
the index stage dir's lock."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.config.pipeline import PipelineConfig
from searchrl.datasets.io import content_sha256
from searchrl.paths import StagePaths
from searchrl.retention import plan_prune, prune, prune_after_run
from searchrl.train.grpo.checkpoint import FORMAT_VERSION


def _config(tmp: Path, *extra: str) -> PipelineConfig:
    return load_config("configs/tiny.yaml", [f"run.work_dir={tmp / 'work'}", *extra])


def _record(storage: Path, name: str, expiration: object) -> None:
    storage.mkdir(exist_ok=True)
    (storage / name).write_text(json.dumps({"metadata": {"expiration": expiration},
                                            "result": "x"}))


def test_an_odd_prefect_record_is_skipped_with_a_warning_and_the_rest_are_pruned(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = tmp_path / "results"
    past, future = datetime.now(UTC) - timedelta(days=1), datetime.now(UTC) + timedelta(days=9)
    _record(storage, "expired", past.isoformat())
    _record(storage, "fresh", future.isoformat())
    _record(storage, "naive", past.replace(tzinfo=None).isoformat())
    _record(storage, "number", 1234567890)
    _record(storage, "garbage", "next tuesday")
    _record(storage, "never", None)
    config = _config(tmp_path)
    with caplog.at_level(logging.WARNING, logger="searchrl.retention"):
        plan = plan_prune(config, None, prefect_storage=storage)
    assert [Path(d.target).name for d in plan.deletions] == ["expired"]
    skipped = "\n".join(plan.skipped)
    assert all(f"{storage / name}: expiration" in skipped for name in ("naive", "number",
                                                                        "garbage"))
    assert "not an ISO time with a zone" in caplog.text
    # The flow's retention step carries on past them too.
    done = prune_after_run(config, "", storage)
    assert done is not None
    assert sorted(p.name for p in storage.iterdir()) == ["fresh", "garbage", "naive", "never",
                                                         "number"]


def _checkpoint(run: Path, step: int, *, corrupt: bool = False) -> Path:
    """A checkpoint as `save_checkpoint` leaves it (weights + manifest of checksums);
    `corrupt`: a weight file changed after its manifest was written."""
    ckpt = run / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(bytes([step]) * 100)
    (ckpt / "manifest.json").write_text(json.dumps({
        "format_version": FORMAT_VERSION, "step": step,
        "files": {"model.safetensors": content_sha256(ckpt / "model.safetensors")}}))
    if corrupt:
        (ckpt / "model.safetensors").write_bytes(b"torn" * 25)
    return ckpt


def test_the_newest_verified_checkpoint_is_kept_and_half_written_ones_are_pruned(
        tmp_path: Path) -> None:
    train = tmp_path / "work" / "train_policy"
    run = train / "checkpoints.superseded-20261201T000000"
    _checkpoint(run, 1)
    good = _checkpoint(run, 2)
    torn = _checkpoint(run, 3, corrupt=True)  # newest by name, fails verification
    (run / ".step_000004.tmp").mkdir()  # SIGKILL mid-save
    (run / ".step_000004.tmp" / "model.safetensors").write_bytes(b"x" * 10)
    live_tmp = train / "checkpoints" / ".step_000009.tmp"  # the live dir: nobody trains now
    live_tmp.mkdir(parents=True)
    plan = prune(_config(tmp_path, "retention.checkpoints_per_run=1"), None)
    gone = {str(Path(d.target).relative_to(train)): d.why for d in plan.deletions}
    assert set(gone) == {f"{run.name}/step_000001", f"{run.name}/step_000003",
                         f"{run.name}/.step_000004.tmp", "checkpoints/.step_000009.tmp"}
    assert "fails verification" in gone[f"{run.name}/step_000003"] and "checksum" in gone[
        f"{run.name}/step_000003"]
    assert good.is_dir() and not torn.exists() and not live_tmp.exists()
    assert sorted(p.name for p in run.iterdir()) == ["step_000002"]


def test_embedding_shards_are_left_alone_while_an_index_build_holds_its_lock(
        tmp_path: Path) -> None:
    config = _config(tmp_path, "retention.embedding_cache_max_bytes=0")
    index_dir = StagePaths(config.run.work_dir).index_dir
    shard = index_dir / "embedding_cache" / "abcd" / "shard-0.hashes.npy"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"h" * 64)
    shard.with_name("shard-0.vectors.npy").write_bytes(b"v" * 64)
    # What `python -m searchrl index` and the flow's task hold for the whole build:
    # stages.build_index's stage_dir_lock, `held(index_dir)` (stages is not imported here:
    # it pulls in torch and transformers, tens of seconds in a fresh process).
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from searchrl.locks import held\n"
         f"with held(Path({str(index_dir)!r}), busy='an index build'):\n"
         "    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            sys.path)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        plan = prune(config, None)
    finally:
        holder.kill()
        holder.wait()
    assert not [d for d in plan.deletions if d.kind == "embedding shard"]
    assert any("index build is in flight" in s for s in plan.skipped)
    assert shard.is_file()
    # The build is over: the cache is cut to its cap.
    assert [d.kind for d in prune(config, None).deletions] == ["embedding shard"]
    assert not shard.exists()
