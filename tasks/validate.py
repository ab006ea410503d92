"""Stage 1: gold-label validation (contracts, quarantine, audit report)."""

from __future__ import annotations

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.contracts.validate import validate_gold_labels as run_validation
from searchrl.data.io import fingerprint
from searchrl.data.sources import source_fingerprint
from searchrl.paths import StagePaths
from searchrl.tracking import stage_run
from searchrl.types import DatasetRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="validate_gold_labels",
      cache_policy=stage_cache_policy("validate_gold_labels", ("data", "validate"),
                                      extra=lambda c: source_fingerprint(c.data)),
      **TASK_DEFAULTS)
def validate_gold_labels(config: PipelineConfig, tracking_uri: str | None,
                         parent_run_id: str | None) -> DatasetRef:
    out_dir = StagePaths(config.run.work_dir).validate_dir
    with stage_run(tracking_uri, parent_run_id, "validate_gold_labels") as sink:
        sink.log_params(config.to_dict()["validate"])
        result = run_validation(config, out_dir)
        sink.log_metrics({f"rows_{k}" if k != "rows_in" else k: v
                          for k, v in result.counts.items()})
        sink.log_artifact(result.quarantine_path, "validation")
        paths = {name: str(p) for name, p in result.split_paths.items()}
        fingerprints = {name: fingerprint(p) for name, p in result.split_paths.items()}
        corpus_fp = fingerprint(result.corpus_path)
        sink.set_tags({f"data.{k}": v for k, v in fingerprints.items()} |
                      {"data.corpus": corpus_fp})
        combined = "|".join(f"{k}={v}" for k, v in sorted(fingerprints.items()))
        return DatasetRef(paths=paths, fingerprints=fingerprints,
                          corpus_path=str(result.corpus_path), corpus_fingerprint=corpus_fp,
                          fingerprint=f"{combined}|corpus={corpus_fp}",
                          mlflow_run_id=sink.run_id)
