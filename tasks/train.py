"""Stage 4: GRPO training (cold start reused from the curriculum stage, DeepSpeed update)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.data.io import fingerprint
from searchrl.paths import StagePaths
from searchrl.retrieval.index_store import load_searcher
from searchrl.tracking import stage_run
from searchrl.train.grpo import train_policy_run
from searchrl.types import CheckpointRef, CurriculumRef, DatasetRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


@task(name="train_policy",
      cache_policy=stage_cache_policy(
          "train_policy", ("run", "model", "rollout", "reward", "curriculum", "train")),
      **TASK_DEFAULTS)
def train_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                 curriculum: CurriculumRef | None, tracking_uri: str | None,
                 parent_run_id: str | None) -> CheckpointRef:
    """Train on the curriculum-ordered set (or the validated train split without one).

    Writes under `<work_dir>/train_policy/`: sft/ (cold start), policy/ (final), checkpoints/,
    metrics.jsonl, curve.png. A re-run after a crash resumes from the newest checkpoint.
    """
    out_dir = StagePaths(config.run.work_dir).train_dir
    train_path = Path(curriculum.train_path if curriculum else dataset.paths["train"])
    with stage_run(tracking_uri, parent_run_id, "train_policy") as sink:
        sink.set_tags({"data.train": fingerprint(train_path), "index": index.fingerprint})
        searcher = load_searcher(Path(index.index_dir), config.index)
        dev = dataset.paths.get("dev")
        result = train_policy_run(config, train_path, Path(dataset.corpus_path), searcher,
                                  out_dir, sft_train_path=Path(dataset.paths["train"]),
                                  dev_path=Path(dev) if dev else None, sink=sink)
        sink.log_metrics({"training_seconds": result.seconds, "sft_seconds": result.sft_seconds,
                          "skipped_steps": result.skipped_steps, "steps": result.steps_done})
        sink.log_artifact(result.metrics_path, "training")
        if result.curve_path is not None:
            sink.log_artifact(result.curve_path, "training")
        sink.log_artifact(result.policy_dir, "policy")
        return CheckpointRef(policy_dir=str(result.policy_dir),
                             fingerprint=fingerprint(result.policy_dir),
                             sft_dir=str(result.sft_dir), metrics_path=str(result.metrics_path),
                             training_seconds=result.seconds + result.sft_seconds,
                             mlflow_run_id=sink.run_id)
