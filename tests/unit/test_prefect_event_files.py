"""prefect.yaml's gold-set trigger and prefect-automations.yaml, read by Prefect's own models
(as `prefect deploy` and flows/automations.py read them): they parse, and
they match the events the pipeline and the steward CLIs send, and nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import yaml
from prefect.cli.deploy._triggers import _initialize_deployment_triggers
from prefect.events.schemas.automations import EventTrigger
from prefect.events.schemas.events import Resource, ResourceSpecification

from flows.automations import AUTOMATIONS_FILE, load_automations
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


def test_automations_parse_and_match_our_events() -> None:
    """Read as flows/automations.py installs them (block ids filled in)."""
    automations = {a.name: a for a in load_automations(AUTOMATIONS_FILE, UUID(int=1))}
    resource = pipeline_resource(PipelineConfig())["prefect.resource.id"]
    no_go = automations["searchrl-no-go"].trigger
    failed = automations["searchrl-run-failed"].trigger
    data = automations["searchrl-data"].trigger
    assert isinstance(no_go, EventTrigger) and isinstance(failed, EventTrigger)
    assert isinstance(data, EventTrigger)
    assert _matches(no_go, "searchrl.decision.no-go", resource)
    assert not _matches(no_go, "searchrl.decision.go", resource)
    assert _matches(data, "searchrl.quarantine.over-threshold", resource)
    assert _matches(data, "searchrl.data.drift", resource)
    # Prefect's own state events of our flow's runs, not of any other flow's
    ours = Resource({"prefect.resource.id": "prefect.flow.1", "prefect.resource.role": "flow",
                     "prefect.resource.name": "searchrl-pipeline"})
    other = Resource({"prefect.resource.id": "prefect.flow.2", "prefect.resource.role": "flow",
                      "prefect.resource.name": "some-other-flow"})
    run = Resource({"prefect.resource.id": "prefect.flow-run.1"})
    for state in ("Failed", "Crashed", "TimedOut"):
        assert f"prefect.flow-run.{state}" in failed.expect
    assert failed.match.matches(run)
    related = (failed.match_related if isinstance(failed.match_related, list)
               else [failed.match_related])
    assert all(isinstance(m, ResourceSpecification) for m in related)
    assert any(m.matches(ours) for m in related if isinstance(m, ResourceSpecification))
    assert not any(m.matches(other) for m in related if isinstance(m, ResourceSpecification))
    notifying = [a for n, a in automations.items() if n != "searchrl-run-lost"]
    assert all(a.actions[0].type == "send-notification" and
               a.actions[0].block_document_id == UUID(int=1) for a in notifying)
    # a run that stops sending heartbeats is marked Crashed (then searchrl-run-failed tells)
    lost = automations["searchrl-run-lost"]
    assert isinstance(lost.trigger, EventTrigger) and lost.trigger.posture == "Proactive"
    assert lost.trigger.after == {"prefect.flow-run.Running", "prefect.flow-run.heartbeat"}
    assert {f"prefect.flow-run.{s}" for s in ("Crashed", "Completed", "Failed")} <= (
        lost.trigger.expect)
    assert lost.actions[0].type == "change-flow-run-state"
    assert lost.actions[0].state.value == "CRASHED"
    assert lost.trigger.within.total_seconds() > 3 * 180  # three default heartbeats missed
    # every searchrl event name they wait for is one tasks/events.py sends
    sent = (ROOT / "tasks" / "events.py").read_text()
    for trigger in (no_go, data):
        for name in trigger.expect:
            assert f'"{name}"' in sent or name.rsplit(".", 1)[0] in sent, name
