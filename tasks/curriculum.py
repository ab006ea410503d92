"""Stage 3: cold-start policy, difficulty per question, zero-variance questions dropped.

The work is `searchrl.stages.filter_curriculum`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.retrieval.provider import SearcherProvider
from searchrl.tracking import stage_run
from searchrl.types import CurriculumRef, DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="filter_curriculum",
      cache_policy=stage_cache_policy(stages.STAGES["filter_curriculum"]), **TASK_DEFAULTS)
def filter_curriculum(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                      tracking_uri: str | None, parent_run_id: str | None,
                      searchers: SearcherProvider | None = None) -> CurriculumRef:
    with stage_run(tracking_uri, parent_run_id, "filter_curriculum") as sink:
        return stages.filter_curriculum(config, dataset, index, sink, searchers=searchers)
