"""Stage 1: gold-label validation (contracts, quarantine, audit report)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.contracts.validate import QuarantineThresholdError
from searchrl.contracts.validate import validate_gold_labels as run_validation
from searchrl.data.io import fingerprint
from searchrl.data.sources import source_fingerprint
from searchrl.paths import StagePaths
from searchrl.tracking import stage_run
from searchrl.types import DatasetRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


def _inputs_fingerprint(config: PipelineConfig) -> str:
    """Data sources + the suites + the stewards' overrides: editing any re-runs the stage."""
    cfg = config.validate_
    parts = [source_fingerprint(config.data)]
    contracts = Path(cfg.contracts_dir)
    for path in sorted(contracts.glob("*.py")) if contracts.is_dir() else []:
        parts.append(f"{path.name}={fingerprint(path)}")
    if cfg.overrides_path is not None and Path(cfg.overrides_path).is_file():
        parts.append(f"overrides={fingerprint(cfg.overrides_path)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@task(name="validate_gold_labels",
      cache_policy=stage_cache_policy("validate_gold_labels", ("data", "validate"),
                                      extra=_inputs_fingerprint),
      **TASK_DEFAULTS)
def validate_gold_labels(config: PipelineConfig, tracking_uri: str | None,
                         parent_run_id: str | None) -> DatasetRef:
    out_dir = StagePaths(config.run.work_dir).validate_dir
    with stage_run(tracking_uri, parent_run_id, "validate_gold_labels") as sink:
        sink.log_params(config.to_dict()["validate"])
        try:
            result = run_validation(config, out_dir)
        except QuarantineThresholdError as exc:
            # The run fails, but the steward needs the report to act on: log it first.
            for path in exc.report_paths:
                sink.log_artifact(path, "validation")
            raise
        sink.log_metrics(result.metrics())
        for path in (result.report_html, result.report_md, result.audit_path,
                     result.quarantine_path):
            if path is not None:
                sink.log_artifact(path, "validation")
        paths = {name: str(p) for name, p in result.split_paths.items()}
        fingerprints = {name: fingerprint(p) for name, p in result.split_paths.items()}
        corpus_fp = fingerprint(result.corpus_path)
        sink.set_tags({f"data.{k}": v for k, v in fingerprints.items()} |
                      {"data.corpus": corpus_fp})
        combined = "|".join(f"{k}={v}" for k, v in sorted(fingerprints.items()))
        return DatasetRef(paths=paths, fingerprints=fingerprints,
                          corpus_path=str(result.corpus_path), corpus_fingerprint=corpus_fp,
                          fingerprint=f"{combined}|corpus={corpus_fp}",
                          mlflow_run_id=sink.run_id,
                          report_path=str(result.report_html) if result.report_html else None)
