"""Stage 6: the cost-payback go/no-go gate, its report, and on GO the registry alias.

The work is `searchrl.stages.decide_go_no_go`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.tracking import stage_run
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, Decision, EvalRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="decide_go_no_go",
      cache_policy=stage_cache_policy(stages.STAGES["decide_go_no_go"]), **TASK_DEFAULTS)
def decide_go_no_go(config: PipelineConfig, dataset: DatasetRef,
                    curriculum: CurriculumRef | None,
                    checkpoint: CheckpointRef, evaluation: EvalRef, tracking_uri: str | None,
                    parent_run_id: str | None) -> Decision:
    with stage_run(tracking_uri, parent_run_id, "decide_go_no_go") as sink:
        return stages.decide_go_no_go(config, dataset, curriculum, checkpoint, evaluation, sink)
