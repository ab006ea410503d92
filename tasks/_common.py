"""What every stage task shares: the cache policy and the task defaults.

A stage's cache key is its name + the resolved work dir + the config values its result depends
on (declared per field in searchrl/config.py, `config.inputs_of`) + the
code it reaches (its library function, every searchrl module that reaches, result-changing
package versions) + the fingerprints of its input references + its inputs outside them; never
the flow-run id or the parent MLflow run id, so a failed pipeline re-run skips finished stages
and a changed input or library module re-runs exactly the stages downstream of it.

A cached result is reused only while the files it references exist with their recorded
fingerprints. When they do not (`make clean`, another checkout, a hand edit), the key moves
on to a successor key, so the stage runs again and its new result is stored there.
"""

from __future__ import annotations

import hashlib
import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect.cache_policies import CacheKeyFnPolicy, CachePolicy
from prefect.context import TaskRunContext
from prefect.results import get_result_store

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig
from searchrl.stages import Stage, ref_is_current
from tasks.events import stage_failed

# How many superseded results of one key may pile up before caching gives up for that key.
_MAX_SUCCESSORS = 64


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def usable_key(base: str) -> str | None:
    """`base`, or the first successor of it whose stored result is still current or absent."""
    store = get_result_store()
    key = base
    for _ in range(_MAX_SUCCESSORS):
        if not store.exists(key):
            return key
        try:
            value = store.read(key).result
        except Exception:  # unreadable (e.g. written by other code): treat as superseded
            value = None
        if ref_is_current(value):
            return key
        key = _sha(f"{key}:superseded")
    return None


def stage_cache_policy(stage: Stage) -> CachePolicy:
    def key_fn(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
        config: PipelineConfig = parameters["config"]
        parts = [stage.name, str(Path(config.run.work_dir).resolve()),
                 config.fingerprint_of(stage.name), code_fingerprint(stage.run),
                 inspect.getsource(context.task.fn)]
        for name, value in sorted(parameters.items()):
            files = getattr(value, "files", None)
            if not isinstance(files, dict):
                continue  # config (its declared inputs count above), tracking uri, run id
            if not ref_is_current(value):
                return None  # an input is gone: run (and fail naming it), cache nothing
            parts.append(f"{name}={value.fingerprint}:{sorted(files.items())}")
        if stage.external_inputs is not None:
            parts.append(stage.external_inputs(config))
        return usable_key(_sha("\n".join(parts)))

    return CacheKeyFnPolicy(cache_key_fn=key_fn)


TASK_DEFAULTS: dict[str, Any] = {
    "persist_result": True,
    "cache_expiration": timedelta(days=30),
    "on_failure": [stage_failed],  # a `searchrl.stage.failed` event for automations
}
