"""What every stage task shares: the cache policy and the stage-run context.

A stage's cache key is its name + its task source + the config sections it reads + the
fingerprints of its input references, never the flow-run id or the parent MLflow run id, so
a failed pipeline re-run skips finished stages and a changed input invalidates exactly the
stages downstream of it. Results are persisted so the cache survives the process.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect.cache_policies import CacheKeyFnPolicy, CachePolicy
from prefect.context import TaskRunContext

from searchrl.config import PipelineConfig


def _ref_fingerprint(value: Any) -> str | None:
    fp = getattr(value, "fingerprint", None)
    if fp is None:
        return None
    return str(fp() if callable(fp) else fp)


def _ref_paths_exist(value: Any) -> bool:
    """A cached reference is only reusable while the files it points at still exist."""
    for name in ("index_dir", "policy_dir", "results_path", "train_path", "corpus_path"):
        path = getattr(value, name, None)
        if isinstance(path, str) and not Path(path).exists():
            return False
    return True


def stage_cache_policy(stage: str, sections: tuple[str, ...],
                       extra: Callable[[PipelineConfig], str] | None = None) -> CachePolicy:
    """Cache on stage source + config sections + input fingerprints (+ `extra(config)`)."""

    def key_fn(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
        config: PipelineConfig = parameters["config"]
        parts = [stage, config.fingerprint(*sections)]
        try:
            parts.append(inspect.getsource(context.task.fn))
        except (OSError, TypeError):
            return None
        for name, value in sorted(parameters.items()):
            if isinstance(value, PipelineConfig):
                continue  # only its named sections count (above), not the whole config
            fp = _ref_fingerprint(value)
            if fp is not None:
                if not _ref_paths_exist(value):
                    return None
                parts.append(f"{name}={fp}")
        if extra is not None:
            parts.append(extra(config))
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    return CacheKeyFnPolicy(cache_key_fn=key_fn)


TASK_DEFAULTS: dict[str, Any] = {
    "persist_result": True,
    "cache_expiration": timedelta(days=30),
}
