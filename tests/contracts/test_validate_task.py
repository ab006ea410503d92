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


def test_extra_eval_sets_are_a_typed_field_of_the_dataset_and_survive_ref_json(
        tmp_path: Path) -> None:
    from searchrl.sinks import NullSink
    from searchrl.stages import corpora_of, eval_sets_of, read_ref, validate_gold_labels
    from searchrl.types import DatasetRef
    from tests.contracts.conftest import DEFECTS

    base = make_defects_config(tmp_path)
    config = base.model_copy(update={"data": base.data.model_copy(update={
        "extra_eval": {"more": str(DEFECTS / "test.jsonl")},
        "extra_corpus": {"more": str(DEFECTS / "corpus.jsonl")}})})
    ref = validate_gold_labels(config, NullSink())
    assert set(ref.paths) == {"train", "dev", "test"}  # splits only, no encoded names
    assert set(ref.extra_evals) == {"more"} and set(ref.extra_corpora) == {"more"}
    more = Path(ref.extra_evals["more"])
    assert more.name == "extra_eval_more.jsonl" and more.read_text() == \
        Path(ref.paths["test"]).read_text()  # same rows, same verdicts
    assert ref.extra_evals["more"] in ref.files and f"extra_eval.more={ref.files[str(more)]}" \
        in ref.fingerprint
    stage_dir = Path(ref.paths["train"]).parent
    assert read_ref(DatasetRef, stage_dir, "validate") == ref
    corpora, evals = corpora_of(ref)
    assert corpora["more"] == Path(ref.extra_corpora["more"]) and evals["more"] == {"more": more}
    assert eval_sets_of(config, ref) == {"more": str(more)}
    # Validation, its audit and steward overrides still name the set's rows by its split name.
    quarantine = (stage_dir / "quarantine.jsonl").read_text()
    assert '"split": "extra_eval:more"' in quarantine
