"""Stage 2: index the corpora (BM25 / dense / hybrid), scan them for poisoning, measure recall.

The work is `searchrl.stages.build_index`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.tracking import stage_run
from searchrl.types import DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="build_index", cache_policy=stage_cache_policy(stages.STAGES["build_index"]),
      **TASK_DEFAULTS)
def build_index(config: PipelineConfig, dataset: DatasetRef, tracking_uri: str | None,
                parent_run_id: str | None) -> IndexRef:
    with stage_run(tracking_uri, parent_run_id, "build_index") as sink:
        return stages.build_index(config, dataset, sink)
