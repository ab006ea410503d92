"""Stage 1: gold-label validation (contracts, quarantine, audit report).

The work is `searchrl.stages.validate_gold_labels`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.tracking import stage_run
from searchrl.types import DatasetRef
from searchrl.validation.validate import QuarantineThresholdError
from tasks._common import TASK_DEFAULTS, stage_cache_policy
from tasks.events import announce_drift, quarantine_over_threshold


@task(name="validate_gold_labels",
      cache_policy=stage_cache_policy(stages.STAGES["validate_gold_labels"]), **TASK_DEFAULTS)
def validate_gold_labels(config: PipelineConfig, tracking_uri: str | None,
                         parent_run_id: str | None) -> DatasetRef:
    with stage_run(tracking_uri, parent_run_id, "validate_gold_labels") as sink:
        try:
            dataset = stages.validate_gold_labels(config, sink)
        except QuarantineThresholdError as exc:
            quarantine_over_threshold(config, str(exc), exc.report_paths)
            raise
    announce_drift(config, dataset)  # a cached result was announced when it was made
    return dataset
