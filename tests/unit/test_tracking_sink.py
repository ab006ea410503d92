"""MlflowSink against a real SQLite store: batched writes land whole, past MLflow's per-request
limits (1000 metrics, 100 params or tags per `log_batch`)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from searchrl.tracking import MlflowSink


def test_batched_metrics_params_and_tags_all_land(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("sink")).info.run_id
    sink = MlflowSink(uri, run_id)
    sink.log_metrics({f"m{i}": float(i) for i in range(1234)}, step=3)
    sink.log_metrics({"m0": 7.0}, step=4)
    sink.log_params({"train": {f"p{i}": i for i in range(150)}, "device": "cpu"})
    sink.set_tags({f"t{i}": str(i) for i in range(120)})
    run = client.get_run(run_id)
    assert len(run.data.metrics) == 1234 and run.data.metrics["m1233"] == 1233.0
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "m0")] == [
        (3, 0.0), (4, 7.0)]
    assert len(run.data.params) == 151 and run.data.params["train.p149"] == "149"
    assert run.data.params["device"] == "cpu"
    assert sum(k.startswith("t") for k in run.data.tags) == 120
