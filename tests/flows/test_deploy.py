"""`prefect deploy` from the repo root against a real local server, run by a process worker:
two runs of the deployment started at once. The deployment's concurrency limit makes the second
wait for the first (enqueued, not cancelled), and the second finds every stage of the first in
the deployment's persistent storage (work dir and Prefect results under $SEARCHRL_DATA_DIR, not
in the Prefect home): it creates no stage child run."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from mlflow import MlflowClient

from searchrl.tracking import PARENT_TAG, child_runs
from tests.flows.test_pipeline_flow import FAST, STAGES
from tests.flows.test_two_weeks import prefect_processes

ROOT = Path(__file__).resolve().parents[2]
RUN_LINE = re.compile(r"^run (\S+) (\S+) start=(\S+) end=(\S+) waited_for_slot=([01])$", re.M)


@pytest.mark.slow
def test_two_runs_of_the_deployment_queue_and_the_second_reuses_the_first(
        tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    data, home, uri = tmp_path / "data", tmp_path / "prefect", f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        ["bash", "scripts/deploy_smoke.sh", *FAST, f"tracking.tracking_uri={uri}"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "BIN": str(bin_dir), "RUNS": "2",
             "SEARCHRL_DATA_DIR": str(data), "PREFECT_HOME": str(home), "HOME": str(tmp_path),
             "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
             "TOKENIZERS_PARALLELISM": "false"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "state: COMPLETED" in proc.stdout
    assert prefect_processes(home) == []  # the worker and the server were stopped

    runs = sorted((datetime.fromisoformat(start), datetime.fromisoformat(end), int(waited))
                  for _, state, start, end, waited in RUN_LINE.findall(proc.stdout))
    assert len(runs) == 2, proc.stdout
    (_, first_end, _), (second_start, _, second_waited) = runs
    assert second_waited == 1 and second_start >= first_end  # queued behind the first

    # The state is where the deployment puts it: the work dir and the stage cache on the data
    # dir; nothing in the Prefect home (a container's, in the Docker deployment).
    assert {p.name for p in (data / "work").iterdir()} >= STAGES
    assert any((data / "prefect-results").iterdir())
    assert not (home / "storage").exists()

    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents = [r for r in client.search_runs(experiments, order_by=["attributes.start_time ASC"])
               if PARENT_TAG not in r.data.tags]
    assert len(parents) == 2
    assert {c["stage"] for c in child_runs(uri, parents[0].info.run_id)} == STAGES
    assert child_runs(uri, parents[1].info.run_id) == []  # every stage came from the first run
