"""Stage 5: evaluate the trained policy and the baselines (greedy, same rollout loop).

The work is `searchrl.stages.evaluate_policy`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.retrieval.provider import SearcherProvider
from searchrl.tracking import stage_run
from searchrl.types import CheckpointRef, DatasetRef, EvalRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="evaluate_policy",
      cache_policy=stage_cache_policy(stages.STAGES["evaluate_policy"]), **TASK_DEFAULTS)
def evaluate_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                    checkpoint: CheckpointRef, tracking_uri: str | None,
                    parent_run_id: str | None, searchers: SearcherProvider | None = None
                    ) -> EvalRef:
    with stage_run(tracking_uri, parent_run_id, "evaluate_policy") as sink:
        return stages.evaluate_policy(config, dataset, index, checkpoint, sink,
                                      searchers=searchers)
