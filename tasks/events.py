"""What the pipeline tells Prefect besides task states: events automations can act on, and the
decision as a markdown artifact. Here, not in the library: `searchrl` never imports prefect.

Events (resource `searchrl.pipeline.<run.name>`, payload as listed):

    searchrl.decision.go / .no-go      the gate's decision: reasons, figures, report path
    searchrl.quarantine.over-threshold validation stopped: the message, the report paths
    searchrl.data.drift                validation warned that the gold set drifted from the
                                       champion's (validate.drift_warn_fraction): the warnings
    searchrl.audit.gold-likely-wrong   evaluation found suspects no earlier run reported
    searchrl.stage.failed              a stage task failed (resource `searchrl.stage.<name>`)
    searchrl.gold-set.updated          the steward CLIs (`apply-audit`, `prepare-data`) post
                                       this one through Prefect's REST API
                                       (`searchrl.notify`); prefect.yaml's trigger runs the
                                       pipeline on it

Payloads that name a report carry `report_url`: under $SEARCHRL_REPORTS_URL (where a team
serves `run.work_dir`, e.g. a web server or bucket) when set, else the file's URI. The
notifications a person gets for these (and for failed or crashed runs, from Prefect's own
flow-run events): prefect-automations.yaml, installed by flows/automations.py.

An event that cannot be sent is logged by Prefect and never fails the run.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event

from searchrl.config import PipelineConfig
from searchrl.eval.audit import new_gold_suspects
from searchrl.eval.run import TRAIN_SUSPECTS_FILE
from searchrl.paths import StagePaths
from searchrl.stages import check_inputs
from searchrl.types import DatasetRef, Decision, EvalRef

SUSPECTS_SHOWN = 20
REPORTS_URL_ENV = "SEARCHRL_REPORTS_URL"


def report_url(path: str | Path | None, work_dir: Path) -> str | None:
    """A link to a report: $SEARCHRL_REPORTS_URL + its path under the work dir, else its URI."""
    if path is None:
        return None
    resolved = Path(path).resolve()
    base = os.environ.get(REPORTS_URL_ENV)
    root = Path(work_dir).resolve()
    if base and resolved.is_relative_to(root):
        return base.rstrip("/") + "/" + resolved.relative_to(root).as_posix()
    return resolved.as_uri()


def pipeline_resource(config: PipelineConfig) -> dict[str, str]:
    return {"prefect.resource.id": f"searchrl.pipeline.{config.run.name}",
            "prefect.resource.name": config.run.name}


def artifact_key(run_name: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    return "searchrl-decision-" + (re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
                                   or "run")


def decision_markdown(decision: Decision, run_name: str) -> str:
    """The decision box, its figures and a link to the full report."""
    icon = "✅" if decision.go else "⛔"
    lines = [f"# {icon} {decision.label}: {run_name}", "",
             *(f"> - {r}" for r in decision.reasons), ""]
    if decision.figures:
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" for k, v in sorted(decision.figures.items())]
        lines.append("")
    if decision.report_html:
        lines.append(f"Full report: [{Path(decision.report_html).name}]"
                     f"({Path(decision.report_html).resolve().as_uri()})"
                     + (f" (markdown: `{decision.report_md}`)" if decision.report_md else ""))
    return "\n".join(lines) + "\n"


def publish_decision(config: PipelineConfig, decision: Decision) -> None:
    """The decision as the flow run's keyed artifact and a go / no-go event."""
    create_markdown_artifact(decision_markdown(decision, config.run.name),
                             key=artifact_key(config.run.name),
                             description=f"searchrl go/no-go decision: {decision.label}")
    emit_event(f"searchrl.decision.{decision.label.lower()}", pipeline_resource(config),
               payload={"go": decision.go, "reasons": list(decision.reasons),
                        "figures": dict(decision.figures), "report_html": decision.report_html,
                        "report_url": report_url(decision.report_html, config.run.work_dir)})


def quarantine_over_threshold(config: PipelineConfig, message: str,
                              report_paths: tuple[Path, ...]) -> None:
    emit_event("searchrl.quarantine.over-threshold", pipeline_resource(config),
               payload={"message": message, "reports": [str(p) for p in report_paths],
                        "max_quarantine_fraction": config.validate_.max_quarantine_fraction,
                        "report_url": report_url(_html(report_paths), config.run.work_dir)})


def _html(paths: tuple[Path, ...]) -> Path | None:
    return next((p for p in paths if p.suffix == ".html"), None)


def announce_drift(config: PipelineConfig, dataset: DatasetRef) -> list[str]:
    """A `searchrl.data.drift` event when validation's audit (audit.json beside the report)
    holds drift warnings; the warnings."""
    audit_path = Path(dataset.report_path or "").parent / "audit.json"
    if dataset.report_path is None or not audit_path.is_file():
        return []
    audit = json.loads(audit_path.read_text(encoding="utf-8"))
    warnings: list[str] = list((audit.get("drift") or {}).get("warnings") or [])
    if warnings:
        emit_event("searchrl.data.drift", pipeline_resource(config),
                   payload={"message": "\n".join(warnings), "warnings": warnings,
                            "drift_warn_fraction": config.validate_.drift_warn_fraction,
                            "report_html": dataset.report_path,
                            "report_url": report_url(dataset.report_path,
                                                     config.run.work_dir)})
    return warnings


def announce_new_suspects(config: PipelineConfig, evaluation: EvalRef) -> list[dict[str, Any]]:
    """An event for `gold_likely_wrong` suspects no earlier run of this work dir reported."""
    check_inputs("announce_new_suspects", evaluation)  # this run's suspects, not another's
    eval_dir = Path(evaluation.results_path).parent
    seen = StagePaths(config.run.work_dir).work_dir / "history" / "gold_suspects_seen.json"
    files = [eval_dir / "suspect_labels.jsonl", eval_dir / TRAIN_SUSPECTS_FILE]
    new: list[dict[str, Any]] = new_gold_suspects(files, seen)
    if new:
        emit_event("searchrl.audit.gold-likely-wrong", pipeline_resource(config),
                   payload={"count": len(new), "keys": [r["key"] for r in new[:SUSPECTS_SHOWN]],
                            "suspects_dir": str(eval_dir)})
    return new


def stage_failed(task: Any, task_run: Any, state: Any) -> None:
    """Task `on_failure` hook: the failed stage as an event."""
    emit_event("searchrl.stage.failed",
               {"prefect.resource.id": f"searchrl.stage.{task.name}",
                "prefect.resource.name": task.name},
               payload={"stage": task.name, "task_run": str(task_run.id),
                        "message": str(state.message or "")[:2000]})
