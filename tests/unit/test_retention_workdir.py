"""Retention of the work dir and Prefect's result records (searchrl/weekly/retention.py),
without a tracking store: an odd result record is skipped with a warning and the rest are
still pruned."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from searchrl.config import load_config
from searchrl.config.pipeline import PipelineConfig
from searchrl.weekly.retention import plan_prune, prune_after_run


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
    with caplog.at_level(logging.WARNING, logger="searchrl.weekly.retention"):
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
