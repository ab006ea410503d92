"""The real Prefect flow under prefect_test_harness with a local sqlite MLflow store."""

from __future__ import annotations

from pathlib import Path

from flows.pipeline import pipeline
from searchrl.tracking import child_runs

# Small enough for the default test run; every stage still runs for real.
FAST = [
    "data.synthetic.n_people=60", "data.synthetic.n_organisations=15",
    "data.synthetic.n_train=60", "data.synthetic.n_dev=10", "data.synthetic.n_test=20",
]


def _overrides(tmp: Path) -> list[str]:
    return [*FAST, f"run.work_dir={tmp / 'work'}",
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]


def test_pipeline_creates_parent_and_child_runs(prefect_harness: None, tmp_path: Path) -> None:
    result = pipeline(config_path="configs/tiny.yaml", overrides=_overrides(tmp_path))
    children = child_runs(result["tracking_uri"], result["parent_run_id"])
    stages = {c["stage"]: c for c in children}
    assert "validate_gold_labels" in stages
    assert all(c["status"] == "FINISHED" for c in children)
    assert stages["validate_gold_labels"]["metrics"]["rows_in"] > 0
    assert Path(result["dataset"].paths["train"]).is_file()


def test_rerun_with_same_inputs_reuses_finished_stages(
    prefect_harness: None, tmp_path: Path
) -> None:
    first = pipeline(config_path="configs/tiny.yaml", overrides=_overrides(tmp_path))
    second = pipeline(config_path="configs/tiny.yaml", overrides=_overrides(tmp_path))
    # Cached stage: same reference back, and no new child run for it.
    assert second["dataset"] == first["dataset"]
    assert not any(c["stage"] == "validate_gold_labels"
                   for c in child_runs(second["tracking_uri"], second["parent_run_id"]))
    changed = pipeline(config_path="configs/tiny.yaml",
                       overrides=[*_overrides(tmp_path), "data.synthetic.seed=99"])
    assert changed["dataset"].fingerprint != first["dataset"].fingerprint
