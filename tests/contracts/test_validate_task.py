"""The Prefect task adapter: metrics and the audit report land in the stage's MLflow child
run (a local sqlite store), and the returned DatasetRef points at the clean splits."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contracts.conftest import ROOT, make_defects_config


def test_task_logs_metrics_and_report_to_its_mlflow_child_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from searchrl.tracking import child_runs, start_parent_run
    from tasks.validate import validate_gold_labels as task

    monkeypatch.chdir(ROOT)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = make_defects_config(tmp_path)
    parent = start_parent_run(uri, "contracts-test", "defects", config.to_dict())
    ref = task.fn(config, uri, parent.run_id)
    assert set(ref.paths) == {"train", "dev", "test"}
    assert ref.report_path is not None and Path(ref.report_path).is_file()
    assert ref.fingerprints["train"] in ref.fingerprint
    (run,) = child_runs(uri, parent.run_id)
    assert run["stage"] == "validate_gold_labels" and run["run_id"] == ref.mlflow_run_id
    m = run["metrics"]
    assert (m["rows_in"], m["rows_clean"], m["rows_quarantined"]) == (24, 9, 15)
    assert m["check_unanswerable"] == 1 and m["check_conflicting_gold"] == 2
    artifacts = {a.path for a in parent.client.list_artifacts(run["run_id"], "validation")}
    assert {"validation/audit_report.html", "validation/audit_report.md",
            "validation/quarantine.jsonl"} <= artifacts
