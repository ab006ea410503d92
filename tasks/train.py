"""Stage 4: GRPO training (cold start reused from the curriculum stage, DeepSpeed update).

The work is `searchrl.stages.train_policy`; this task adds
the MLflow child run and the cache.
"""

from __future__ import annotations

from prefect import task

from searchrl import stages
from searchrl.config import PipelineConfig
from searchrl.retrieval.provider import SearcherProvider
from searchrl.tracking import stage_run
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="train_policy", cache_policy=stage_cache_policy(stages.STAGES["train_policy"]),
      **TASK_DEFAULTS)
def train_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                 curriculum: CurriculumRef | None, tracking_uri: str | None,
                 parent_run_id: str | None, searchers: SearcherProvider | None = None
                 ) -> CheckpointRef:
    with stage_run(tracking_uri, parent_run_id, "train_policy") as sink:
        return stages.train_policy(config, dataset, index, curriculum, sink,
                                   searchers=searchers)
