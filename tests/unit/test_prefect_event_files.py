"""prefect.yaml's gold-set trigger and prefect-automations.yaml, read by Prefect's own models
(as `prefect deploy` and `prefect automation create --from-file` read them): they parse, and
they match the events the pipeline and the steward CLIs send, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect.cli.deploy._triggers import _initialize_deployment_triggers
from prefect.events.schemas.automations import AutomationCore, EventTrigger
from prefect.events.schemas.events import Resource

from searchrl.config import PipelineConfig
from searchrl.notify import GOLD_SET_RESOURCE, GOLD_SET_UPDATED
from tasks.events import pipeline_resource

ROOT = Path(__file__).resolve().parents[2]


def _deployment(name: str) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return next(d for d in spec["deployments"] if d["name"] == name)


def _matches(trigger: EventTrigger, event: str, resource_id: str) -> bool:
    return (event in trigger.expect
            and trigger.match.matches(Resource({"prefect.resource.id": resource_id})))


def test_weekly_deployment_also_runs_on_gold_set_updates() -> None:
    deployment = _deployment("searchrl-weekly-gpu")
    assert deployment["schedules"][0]["cron"]  # beside the cron, not instead of it
    triggers = _initialize_deployment_triggers(deployment["name"], deployment["triggers"])
    assert len(triggers) == 1
    trigger = triggers[0]
    assert isinstance(trigger, EventTrigger)
    for source in ("apply-audit", "prepare-data"):  # the resources searchrl.notify posts
        assert _matches(trigger, GOLD_SET_UPDATED, f"{GOLD_SET_RESOURCE}.{source}")
    assert not _matches(trigger, "searchrl.decision.go", f"{GOLD_SET_RESOURCE}.apply-audit")
    assert not _matches(trigger, GOLD_SET_UPDATED, "searchrl.pipeline.tiny")


def test_example_automations_parse_and_match_our_events() -> None:
    spec = yaml.safe_load((ROOT / "prefect-automations.yaml").read_text())
    automations = {a["name"]: AutomationCore.model_validate(a) for a in spec["automations"]}
    resource = pipeline_resource(PipelineConfig())["prefect.resource.id"]
    no_go = automations["searchrl-no-go"].trigger
    failed = automations["searchrl-failed"].trigger
    assert isinstance(no_go, EventTrigger) and isinstance(failed, EventTrigger)
    assert _matches(no_go, "searchrl.decision.no-go", resource)
    assert not _matches(no_go, "searchrl.decision.go", resource)
    assert _matches(failed, "searchrl.stage.failed", "searchrl.stage.train_policy")
    assert _matches(failed, "searchrl.quarantine.over-threshold", resource)
    assert all(a.actions[0].type == "send-notification" for a in automations.values())
    # every event name they wait for is one tasks/events.py sends
    sent = (ROOT / "tasks" / "events.py").read_text()
    for trigger in (no_go, failed):
        for name in trigger.expect:
            assert name.rsplit(".", 1)[0] in sent, name
