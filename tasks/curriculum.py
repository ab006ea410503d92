"""Stage 3: difficulty-curriculum filtering with the starting (SFT) policy.

The difficulty must be measured with the policy RL starts from, so this stage first runs the
cold start (tiny model: tokenizer + SFT on scripted demonstrations; pretrained: optional SFT)
into the training stage's `sft/` directory; the trainer then reuses it (cached on a key file).
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.curriculum.stage import run_curriculum
from searchrl.data.io import fingerprint, read_passages, read_qa
from searchrl.paths import StagePaths
from searchrl.retrieval.index_store import load_searcher
from searchrl.tracking import stage_run
from searchrl.train.grpo import cold_start
from searchrl.types import CurriculumRef, DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="filter_curriculum",
      cache_policy=stage_cache_policy(
          "filter_curriculum",
          ("run", "model", "rollout", "reward", "curriculum", "index", "train")),
      **TASK_DEFAULTS)
def filter_curriculum(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                      tracking_uri: str | None, parent_run_id: str | None) -> CurriculumRef:
    paths = StagePaths(config.run.work_dir)
    train_path = Path(dataset.paths["train"])
    with stage_run(tracking_uri, parent_run_id, "filter_curriculum") as sink:
        sink.log_params(config.to_dict()["curriculum"])
        searcher = load_searcher(Path(index.index_dir), config.index)
        sft_dir = cold_start(config, read_qa(train_path), read_passages(dataset.corpus_path),
                             searcher, paths.train_dir / "sft", sink)
        result = run_curriculum(config, train_path, sft_dir, searcher, paths.curriculum_dir)
        sink.log_metrics({k: float(v) for k, v in result.counts.items()}
                         | {"mean_pass_rate": result.mean_pass_rate})
        for artifact in (result.train_path, result.difficulty_path, result.dropped_path,
                         result.histogram_path):
            sink.log_artifact(artifact, "curriculum")
        return CurriculumRef(train_path=str(result.train_path),
                             fingerprint=fingerprint(result.train_path),
                             difficulty_path=str(result.difficulty_path),
                             dropped_path=str(result.dropped_path),
                             mlflow_run_id=sink.run_id)
