"""Faults at the edges: an unreachable MLflow store fails the run before any stage; a full disk
during an artifact write leaves neither a partial file nor a manifest; unsafe names never
become paths."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import pytest

from searchrl.datasets.io import manifest_path, read_manifest, write_jsonl
from searchrl.paths import safe_filename
from searchrl.tracking import TrackingError, check_tracking_store


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_mlflow_server_fails_fast_with_the_fix() -> None:
    start = time.monotonic()
    with pytest.raises(TrackingError) as info:
        check_tracking_store(f"http://127.0.0.1:{_dead_port()}", timeout_s=2.0)
    assert time.monotonic() - start < 10
    assert "unreachable" in str(info.value) and "MLFLOW_TRACKING_URI" in str(info.value)


def test_unusable_sqlite_store_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a directory path through a regular file cannot be created
    with pytest.raises(TrackingError, match="not usable"):
        check_tracking_store(f"sqlite:///{blocker / 'sub' / 'mlflow.db'}", timeout_s=2.0)


def test_pipeline_refuses_to_start_without_a_store(prefect_harness: None, tmp_path: Path) -> None:
    from flows.pipeline import pipeline

    with pytest.raises(TrackingError):
        pipeline(config_path="configs/tiny.yaml",
                 overrides=[f"run.work_dir={tmp_path / 'w'}",
                            f"tracking.tracking_uri=http://127.0.0.1:{_dead_port()}",
                            "tracking.connect_timeout_s=2"])
    assert not (tmp_path / "w").exists()  # no stage ran


def test_disk_full_during_write_leaves_nothing_marked_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "train.jsonl"
    write_jsonl(path, [{"id": "a", "question": "q?", "golden_answers": ["x"]}])
    before = path.read_bytes()
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_jsonl(path, [{"id": "b", "question": "r?", "golden_answers": ["y"]}] * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    # The previous complete file is untouched, its stale manifest was removed first, and no
    # temp file is left behind.
    assert path.read_bytes() == before
    assert not manifest_path(path).exists() and read_manifest(path) is None
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("name", ["../../etc/passwd", "/abs/path", "a/b", "..", "x\x00y"])
def test_unsafe_names_never_escape(name: str, tmp_path: Path) -> None:
    try:
        cleaned = safe_filename(name)
    except ValueError:
        return
    target = (tmp_path / cleaned).resolve()
    assert target.parent == tmp_path.resolve()
    assert "/" not in cleaned and not cleaned.startswith(".")
