"""The run's identity (name, seed, working directory, device) and the tracking store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import field_validator

from searchrl.config.base import OPERATIONAL, POLICY, Section, shapes
from searchrl.paths import safe_filename


class RunConfig(Section):
    SHAPES = POLICY
    name: Annotated[str, shapes("validate_gold_labels", "decide_go_no_go")] = "tiny"  # titles
    seed: int = 0
    # Stage keys add the resolved directory themselves.
    work_dir: Annotated[Path, OPERATIONAL] = Path("runs/tiny")
    device: Literal["cpu", "cuda", "auto"] = "auto"

    @field_validator("name")
    @classmethod
    def _usable_name(cls, name: str) -> str:
        # It names the registered model (searchrl-<name>), MLflow runs and report files: a
        # name none of them can take would fail only at the gate, after training.
        try:
            safe = safe_filename(name)
        except ValueError:
            safe = "tiny"
        if safe != name:
            raise ValueError(f"run.name={name!r} cannot name the registered model, MLflow "
                             "runs and files: use letters, digits, '.', '-' and '_' (at most "
                             f"128, not starting with '.'), e.g. {safe!r}")
        return name

    @field_validator("work_dir", mode="before")
    @classmethod
    def _own_directory(cls, value: Any) -> Any:
        # "" and "." are the directory the command runs in (the checkout): every stage's
        # outputs would land beside the code.
        if isinstance(value, str | Path) and Path(str(value).strip() or ".") == Path("."):
            raise ValueError(f"run.work_dir={str(value)!r} is the current directory: every "
                             "stage would write into it; give the run a directory of its own, "
                             "e.g. runs/<run.name>")
        return value


class TrackingConfig(Section):
    SHAPES = OPERATIONAL
    # None -> $MLFLOW_TRACKING_URI, else a local sqlite store under the working directory.
    tracking_uri: str | None = None
    experiment: str = "searchrl"
    # Fail fast when the store cannot be reached, before any expensive stage starts.
    connect_timeout_s: float = 10.0
