"""The pipeline's Prefect events and decision artifact reach a real Prefect API (Prefect's own
test harness): the decision artifact and go/no-go event, the quarantine event from the real
validation task, new gold-likely-wrong suspects (once), a failed stage's event, and the
steward CLI's gold-set-updated event posted over REST without prefect."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.events.filters import EventFilter, EventNameFilter
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL

from searchrl.config import PipelineConfig
from searchrl.notify import GOLD_SET_UPDATED, post_event
from searchrl.types import Decision, EvalRef
from searchrl.validation.validate import QuarantineThresholdError
from tasks.events import (
    announce_new_suspects,
    artifact_key,
    publish_decision,
    stage_failed,
)
from tasks.validate import validate_gold_labels
from tests.contracts.conftest import make_defects_config

pytestmark = pytest.mark.usefixtures("prefect_harness")
ROOT = Path(__file__).resolve().parents[2]


def _events(name: str, match: Callable[[Any], bool], timeout_s: float = 30.0) -> list[Any]:
    """Events called `name` that `match`, once the API has stored one (it persists events in
    batches; other tests' events of the same name may be there already)."""
    EventsWorker.drain_all()
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(EventFilter(event=EventNameFilter(name=[name])), limit=50)
            found = [e for e in page.events if match(e)]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def _config(tmp_path: Path, name: str) -> PipelineConfig:
    return PipelineConfig.model_validate({"run": {"name": name,
                                                  "work_dir": str(tmp_path / "run")}})


def test_decision_artifact_and_event(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    decision = Decision(go=False, reasons=("payback 40 weeks > 26",), report_html=str(report),
                        figures={"delta_em": 0.012})

    @flow
    def decide() -> None:
        publish_decision(_config(tmp_path, "Events_Run"), decision)

    decide()
    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()
        mine = [a for a in artifact if a.key == artifact_key("Events_Run")]
    assert artifact_key("Events_Run") == "searchrl-decision-events-run"
    assert mine, "the decision artifact is not in the API"
    body = str(mine[0].data)
    assert "NO-GO: Events_Run" in body and "payback 40 weeks > 26" in body
    assert "delta_em" in body and report.resolve().as_uri() in body
    ours = _events("searchrl.decision.no-go",
                   lambda e: e.resource.id == "searchrl.pipeline.Events_Run")
    assert ours and ours[0].payload["reasons"] == ["payback 40 weeks > 26"]


def test_quarantine_event_from_the_validation_task(tmp_path: Path) -> None:
    config = make_defects_config(tmp_path, max_quarantine_fraction=0.01)

    @flow
    def validate() -> None:
        validate_gold_labels(config, None, None)

    with pytest.raises(QuarantineThresholdError):
        validate()
    events = _events("searchrl.quarantine.over-threshold",
                     lambda e: e.resource.id == "searchrl.pipeline.defects")
    assert events and "validate.max_quarantine_fraction=0.01" in events[0].payload["message"]
    assert any(p.endswith("audit_report.html") for p in events[0].payload["reports"])
    # the failed stage's own event (the task's on_failure hook)
    failed = _events("searchrl.stage.failed",
                     lambda e: e.payload["stage"] == "validate_gold_labels")
    assert failed and "quarantined" in failed[0].payload["message"]


def test_new_gold_suspects_announced_once(tmp_path: Path) -> None:
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    rows = [{"key": "test/q1", "tier": "gold_likely_wrong"},
            {"key": "test/q2", "tier": "policy_error"}]
    (eval_dir / "suspect_labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ref = EvalRef(results_path=str(eval_dir / "results.json"), fingerprint="x")
    config = _config(tmp_path, "suspects")

    @flow
    def announce() -> list[int]:
        return [len(announce_new_suspects(config, ref)), len(announce_new_suspects(config, ref))]

    assert announce() == [1, 0]
    events = _events("searchrl.audit.gold-likely-wrong",
                     lambda e: e.resource.id == "searchrl.pipeline.suspects")
    assert len(events) == 1 and events[0].payload["keys"] == ["test/q1"]


def test_failed_stage_event(tmp_path: Path) -> None:
    @task(name="broken_stage", on_failure=[stage_failed])
    def broken() -> None:
        raise RuntimeError("index file missing: rerun build_index")

    @flow
    def run() -> None:
        broken()

    with pytest.raises(RuntimeError):
        run()
    events = _events("searchrl.stage.failed",
                     lambda e: e.resource.id == "searchrl.stage.broken_stage")
    assert events and "rerun build_index" in events[0].payload["message"]


def test_apply_audit_posts_gold_set_updated(tmp_path: Path) -> None:
    """The CLI, a separate process with PREFECT_API_URL set, posts over REST (no prefect)."""
    api = PREFECT_API_URL.value()
    decisions = tmp_path / "decided.jsonl"
    decisions.write_text(json.dumps({"key": "test/q9", "example_id": "q9", "split": "test",
                                     "tier": "gold_likely_wrong", "decision": "accept",
                                     "steward": "jdoe"}) + "\n")
    overrides = tmp_path / "overrides.yaml"
    env = {**os.environ, "PREFECT_API_URL": api}
    proc = subprocess.run(
        [sys.executable, "-m", "searchrl", "apply-audit", "--decisions", str(decisions),
         f"validate.overrides_path={overrides}", f"run.work_dir={tmp_path / 'run'}"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr
    events = _events(GOLD_SET_UPDATED,
                     lambda e: e.resource.id == "searchrl.gold-set.apply-audit"
                     and e.payload.get("overrides") == str(overrides))
    assert events and events[0].payload["added"] == "1"


def test_post_event_without_or_with_an_unreachable_api(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert post_event(GOLD_SET_UPDATED, "x", {}) is False  # nothing configured: silent
    assert capsys.readouterr().err == ""
    assert post_event(GOLD_SET_UPDATED, "x", {}, api_url="http://127.0.0.1:9/api") is False
    assert "could not post searchrl.gold-set.updated" in capsys.readouterr().err
