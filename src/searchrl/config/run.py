"""The run's identity (name, seed, working directory, device) and the tracking store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from searchrl.config.base import OPERATIONAL, POLICY, Section, shapes


class RunConfig(Section):
    SHAPES = POLICY
    name: Annotated[str, shapes("validate_gold_labels", "decide_go_no_go")] = "tiny"  # titles
    seed: int = 0
    # Stage keys add the resolved directory themselves.
    work_dir: Annotated[Path, OPERATIONAL] = Path("runs/tiny")
    device: Literal["cpu", "cuda", "auto"] = "auto"


class TrackingConfig(Section):
    SHAPES = OPERATIONAL
    # None -> $MLFLOW_TRACKING_URI, else a local sqlite store under the working directory.
    tracking_uri: str | None = None
    experiment: str = "searchrl"
    # Fail fast when the store cannot be reached, before any expensive stage starts.
    connect_timeout_s: float = 10.0
