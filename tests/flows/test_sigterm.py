"""SIGTERM to `flows/pipeline.py` (a scheduler's timeout, `kill`) ends the whole process tree.

Run as a plain script, Prefect starts a temporary API server (a uvicorn child) and stops it
in an exit handler. On SIGTERM Prefect marks the flow run Crashed and re-sends the signal to
the handler it replaced; with Python's default the process died without exit handlers and the
server outlived it, one more per killed run. The pipeline now exits 143 through its exit
handlers: no child survives, and the MLflow parent run is marked FAILED.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import psutil
import pytest

from tests.conftest import REPO_ROOT
from tests.flows.test_pipeline_flow import FAST


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s} s: {log.read_text()}"
        time.sleep(0.2)


@pytest.mark.slow  # a flow subprocess with its own Prefect server (~40 s): CI's slow run
def test_sigterm_stops_prefects_temporary_server_and_fails_the_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")  # no API configured: a temporary server
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log = tmp_path / "pipeline.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "flows/pipeline.py", "--config", "configs/tiny.yaml", *FAST,
             f"run.work_dir={tmp_path / 'work'}", f"tracking.tracking_uri={uri}"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    children: list[psutil.Process] = []
    try:
        # Mid-flow: the first stage has finished (the MLflow parent run exists).
        _wait_for(log, "Task run 'validate_gold_labels", proc, timeout_s=240)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("uvicorn" in " ".join(c.cmdline()) for c in children), children
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [" ".join(c.cmdline()) for c in alive]
    finally:  # a failed check leaves no process behind either
        for leftover in [p for p in children if p.is_running()]:
            leftover.kill()
        if proc.poll() is None:
            proc.kill()
    # Crashed, or (a SIGTERM while Prefect creates the next task run) Failed: both say why.
    assert "Execution was aborted by a termination signal" in log.read_text()
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("searchrl-tiny")
    assert experiment is not None
    parents = [r for r in client.search_runs([experiment.experiment_id])
               if "mlflow.parentRunId" not in r.data.tags]
    assert [r.info.status for r in parents] == ["FAILED"]


def test_a_sigterm_while_prefect_starts_a_stage_still_exits_143(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Seen in CI: SIGTERM right after a stage finished. Prefect's handler raised inside the
    next task run's creation and its task engine failed with "Task run is not set": the run
    ended Failed and the script exited 70 (a bug) instead of 143."""
    from prefect.exceptions import TerminationSignal

    import flows.pipeline as script

    def stopped_between_stages(**_: object) -> None:
        try:
            raise TerminationSignal(signal.SIGTERM)
        except TerminationSignal:
            raise ValueError("Task run is not set") from None  # as Prefect's engine does

    monkeypatch.setattr(script, "pipeline", stopped_between_stages)
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert script.main(["--config", "configs/tiny.yaml"]) == 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, before)  # main() installs its handler
    assert "stopped by signal 15" in capsys.readouterr().err
