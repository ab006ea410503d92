"""Where stages and the trainer log: the `MetricsSink` protocol and `NullSink`.

Kept free of mlflow so that the library (every DeepSpeed rank, the retrieval service) imports
no tracking client; `searchrl.tracking` implements the protocol with MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol


class MetricsSink(Protocol):
    @property
    def run_id(self) -> str | None: ...

    @property
    def tracking_uri(self) -> str | None:
        """The store the run lives in (None without tracking): registry lookups use it."""
        ...

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...


class NullSink:
    """Discards everything; `run_id` and `tracking_uri` are None."""

    @property
    def run_id(self) -> str | None:
        return None

    @property
    def tracking_uri(self) -> str | None:
        return None

    def log_params(self, params: Mapping[str, Any]) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        return None
