"""What the weekly loop keeps on disk and in the registry (searchrl/retention.py).

Operational throughout: retention deletes what no result depends on, so no cache key,
checkpoint run identity or index key reads it (a changed retention re-runs nothing)."""

from __future__ import annotations

from pydantic import Field

from searchrl.config.base import OPERATIONAL, Section


class RetentionConfig(Section):
    SHAPES = OPERATIONAL
    # Prune at the end of every flow run (after the decision); `python -m searchrl prune`
    # prunes by hand whatever this says.
    enabled: bool = True
    # Runs ("weeks") whose records are kept: MLflow parent runs (with their stage runs and
    # artifacts) and training runs superseded in the work dir
    # (train_policy/checkpoints.superseded-*), newest first. Older ones are deleted unless
    # they hold a kept model version or are pinned.
    keep_weeks: int = Field(4, ge=1)
    # Registered model versions kept besides every aliased one (champion, previous-champion,
    # challenger) and the pinned ones: the newest this many. Older versions are deleted from
    # the registry with their logged policy.
    keep_challengers: int = Field(3, ge=0)
    # Checkpoints kept in each superseded training run (its newest verified steps; the
    # run's best policy lives outside them, in best_policy/). The live run's checkpoints
    # follow train.* (its newest plus the best under keep_best).
    checkpoints_per_run: int = Field(1, ge=0)
    # The passage-embedding cache (build_index/embedding_cache) is cut to this size, least
    # recently used shards first (a build touches the shards it reads). None: no cap.
    embedding_cache_max_bytes: int | None = Field(20 * 1024**3, ge=0)
    # Prefect result records (the stage cache) past their own expiration
    # (tasks/_common.py's cache_expiration) are deleted from the local result storage.
    prefect_expired_results: bool = True
    # A RUNNING MLflow run started less than this long ago marks the work dir as in flight
    # (nothing in it is pruned) and keeps its week; an older one is a crashed run (SIGKILL,
    # lost machine: it never finishes) and protects nothing.
    running_stale_hours: float = Field(48.0, gt=0.0)
    # MLflow run ids and registered model versions (as "v3" or "3") never deleted; a model
    # version tagged `pinned=true` is kept as well.
    pinned: tuple[str, ...] = ()
