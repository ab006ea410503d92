"""Stage 5: evaluate the trained policy and the baselines (greedy, same rollout loop)."""

from __future__ import annotations

import math

from prefect import task

from searchrl.config import PipelineConfig
from searchrl.data.io import fingerprint
from searchrl.eval.run import RESULTS_FILE, evaluate_stage
from searchrl.paths import StagePaths
from searchrl.tracking import registered_policy, resolve_tracking_uri, stage_run
from searchrl.types import CheckpointRef, DatasetRef, EvalRef, IndexRef
from tasks._common import TASK_DEFAULTS, stage_cache_policy


def _champion_version(config: PipelineConfig) -> str:
    """A newly registered champion invalidates the cached evaluation."""
    if "champion" not in config.eval.baselines:
        return "champion:not-requested"
    try:
        uri = resolve_tracking_uri(config.tracking.tracking_uri)
        found = registered_policy(uri, config.eval.registry_model_name,
                                  config.eval.champion_alias)
    except Exception:  # an unreachable store must not break cache-key computation
        return "champion:unknown"
    return f"champion:{found['version'] if found else 'none'}"


@task(name="evaluate_policy",
      cache_policy=stage_cache_policy("evaluate_policy",
                                      ("run", "index", "model", "rollout", "reward", "eval"),
                                      extra=_champion_version),
      **TASK_DEFAULTS)
def evaluate_policy(config: PipelineConfig, dataset: DatasetRef, index: IndexRef,
                    checkpoint: CheckpointRef, tracking_uri: str | None,
                    parent_run_id: str | None) -> EvalRef:
    out_dir = StagePaths(config.run.work_dir).eval_dir
    split = config.eval.split
    if split not in dataset.paths:
        raise KeyError(f"eval.split={split!r} is not in the validated dataset "
                       f"(splits: {sorted(dataset.paths)})")
    with stage_run(tracking_uri, parent_run_id, "evaluate_policy") as sink:
        sink.log_params(config.to_dict()["eval"])
        sink.set_tags({"data.eval": dataset.fingerprints.get(split, ""),
                       "policy": checkpoint.fingerprint})
        result = evaluate_stage(config, eval_path=dataset.paths[split],
                                index_dir=index.index_dir, policy_dir=checkpoint.policy_dir,
                                sft_dir=checkpoint.sft_dir, out_dir=out_dir,
                                tracking_uri=tracking_uri)
        metrics: dict[str, float] = {"n_questions": result.n_questions,
                                     "suspect_labels": result.n_suspects}
        for name, s in result.systems.items():
            summary = s.summary
            metrics |= {f"{name}.em": summary.em.mean, f"{name}.em_lo": summary.em.lo,
                        f"{name}.em_hi": summary.em.hi, f"{name}.f1": summary.f1.mean,
                        f"{name}.searches_per_question": summary.searches_per_question,
                        f"{name}.format_rate": summary.format_rate,
                        f"{name}.tokens_per_query": summary.tokens_per_query,
                        f"{name}.latency_s": summary.latency_s}
        for name, d in result.deltas.items():
            metrics |= {f"delta_em.{name}": d.mean, f"delta_em.{name}_lo": d.lo,
                        f"delta_em.{name}_hi": d.hi}
        sink.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
        # Top-level files only: a downloaded champion policy is not an evaluation artifact.
        for path in sorted(out_dir.iterdir()):
            if path.is_file():
                sink.log_artifact(path, "evaluation")
        results_path = out_dir / RESULTS_FILE
        return EvalRef(results_path=str(results_path), fingerprint=fingerprint(results_path),
                       mlflow_run_id=sink.run_id)
