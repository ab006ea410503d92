"""What a weekly re-run reacts to, through the real flow: a steward's corrected gold label
reaches the model (the cold start and training start again, the old checkpoints moved aside),
a service setting re-runs nothing. The keys come from the one declaration in config.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.pipeline import pipeline
from searchrl.datasets.io import read_qa
from searchrl.tracking import child_runs
from tests.flows.test_pipeline_flow import FAST

CONFIG = "configs/tiny.yaml"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    tmp = tmp_path_factory.mktemp("steward")
    overrides = tmp / "overrides.yaml"
    overrides.write_text("[]\n")
    return [*FAST, "curriculum.enabled=false", "train.steps=2", "train.checkpoint_every=1",
            f"validate.overrides_path={overrides}", f"run.work_dir={tmp / 'work'}",
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"], overrides


@pytest.fixture(scope="module")
def week_one(prefect_harness: None, workspace: tuple[list[str], Path]) -> dict[str, Any]:
    return pipeline(config_path=CONFIG, overrides=workspace[0])


def _stages_run(result: dict[str, Any]) -> set[str]:
    return {c["stage"] for c in child_runs(result["tracking_uri"], result["parent_run_id"])}


def _train_metrics(result: dict[str, Any]) -> dict[str, float]:
    runs = child_runs(result["tracking_uri"], result["parent_run_id"])
    return next(c["metrics"] for c in runs if c["stage"] == "train_policy")


def test_a_service_setting_reruns_nothing(week_one: dict[str, Any],
                                          workspace: tuple[list[str], Path]) -> None:
    again = pipeline(config_path=CONFIG, overrides=[
        *workspace[0], "index.service_rate_limit_per_s=5", "index.client_timeout_s=3",
        "index.max_batch=32", "train.launch.stall_timeout_s=100", "train.keep_checkpoints=3"])
    assert _stages_run(again) == set()
    assert again["checkpoint"] == week_one["checkpoint"]


def test_a_corrected_label_reaches_the_model(week_one: dict[str, Any],
                                            workspace: tuple[list[str], Path]) -> None:
    overrides_list, overrides_file = workspace
    train = read_qa(week_one["dataset"].paths["train"])
    # A clean row gets another answer the corpus holds: another row's of the same type.
    row, other = next((a, b) for a in train for b in train
                      if a.type == b.type and a.golden_answers != b.golden_answers)
    overrides_file.write_text(yaml.safe_dump([{
        "id": row.id, "action": "correct", "golden_answers": list(other.golden_answers),
        "reason": "test: steward correction", "steward": "test"}]))
    train_dir = Path(week_one["checkpoint"].policy_dir).parent
    sft_key_before = (train_dir / "sft" / "searchrl_sft.json").read_text()

    week_two = pipeline(config_path=CONFIG, overrides=overrides_list)

    ran = _stages_run(week_two)
    assert {"validate_gold_labels", "train_policy", "evaluate_policy"} <= ran
    # build_index re-runs (its recall is measured on the changed splits) but the corpus did
    # not change: every index component is reused, so the index is the same.
    assert week_two["index"].fingerprint == week_one["index"].fingerprint
    corrected = {e.id: e for e in read_qa(week_two["dataset"].paths["train"])}[row.id]
    assert corrected.golden_answers == other.golden_answers
    # The cold start was made again from the corrected data ...
    assert json.loads((train_dir / "sft" / "searchrl_sft.json").read_text()) != json.loads(
        sft_key_before)
    # ... and training started afresh: week one's checkpoints were moved aside, not resumed.
    assert list(train_dir.glob("checkpoints.superseded-*"))
    metrics = _train_metrics(week_two)
    assert metrics["steps"] == 2 and metrics["earlier_attempts_seconds"] == 0.0
