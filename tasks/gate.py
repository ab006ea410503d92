"""Stage 6: the cost-payback go/no-go gate, its report, and on GO the registry alias."""

from __future__ import annotations

import math
from pathlib import Path

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.eval.run import load_eval_result
from searchrl.gate.report import count_rows, write_gate_report
from searchrl.paths import StagePaths
from searchrl.tracking import register_policy, stage_run
from searchrl.types import CheckpointRef, DatasetRef, Decision, EvalRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="decide_go_no_go",
      cache_policy=stage_cache_policy("decide_go_no_go", ("run", "eval", "gate")),
      **TASK_DEFAULTS)
def decide_go_no_go(config: PipelineConfig, dataset: DatasetRef, checkpoint: CheckpointRef,
                    evaluation: EvalRef, tracking_uri: str | None,
                    parent_run_id: str | None) -> Decision:
    out_dir = StagePaths(config.run.work_dir).gate_dir
    with stage_run(tracking_uri, parent_run_id, "decide_go_no_go") as sink:
        sink.log_params(config.to_dict()["gate"])
        outcome = write_gate_report(
            config, load_eval_result(evaluation.results_path), out_dir,
            gold_pairs=count_rows(dataset.paths.get("train")),
            training_seconds=checkpoint.training_seconds,
            metrics_path=checkpoint.metrics_path)
        result = outcome.result
        sink.set_tags({"decision": result.label})
        sink.log_metrics({k: v for k, v in outcome.figures.items() if math.isfinite(v)})
        sink.log_artifact(out_dir, "report")
        if result.go and tracking_uri is not None and sink.run_id is not None:
            version = register_policy(
                tracking_uri, sink.run_id, Path(checkpoint.policy_dir),
                config.eval.registry_model_name, config.gate.registry_alias,
                tags={"decision": "GO", "policy_fingerprint": checkpoint.fingerprint})
            sink.set_tags({"registered_version": version})
        return Decision(go=result.go, reasons=result.reasons,
                        report_html=str(outcome.html_path), report_md=str(outcome.md_path),
                        figures=outcome.figures, mlflow_run_id=sink.run_id)
