"""A retriever that dies mid-pipeline fails the flow, caches nothing and decides nothing.

The real external retrieval server (`python -m searchrl.retrieval.server`, index.mode=service,
service_managed=false) serves the index the flow built; it is SIGKILLed as evaluate_policy
starts (the one injected fault: the stage function is wrapped to kill it first, then runs as
is). The flow run ends Failed with RetrieverFailedError naming the service URL and the failed
count; evaluate_policy and the gate cache nothing (a re-run with a live server runs them for
real), no decision or report is written, nothing is registered, and `flows/pipeline.py`'s
main exits 7.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import flows.pipeline as pipeline_module
from flows.pipeline import pipeline
from searchrl import stages
from searchrl.paths import StagePaths
from searchrl.tracking import child_runs
from tests.flows.test_pipeline_flow import FAST
from tests.helpers import free_port

pytestmark = pytest.mark.slow  # three short pipelines (~2 minutes on 2 cores)

TOKEN_ENV = "SEARCHRL_RETRIEVER_TOKEN"  # configs/tiny.yaml's index.service_token_env


def _start_server(index_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "searchrl.retrieval.server", "--index-dir", str(index_dir),
             "--config", "configs/tiny.yaml", "--host", "127.0.0.1", "--port", str(port),
             "--no-access-log"], stdout=out, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != TOKEN_ENV})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"retrieval server did not start: {log.read_text()}")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def setup(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("retriever_failure")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    overrides = [*FAST, "eval.baselines=[retrieve_once]", f"run.work_dir={tmp / 'work'}",
                 f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", "index.mode=service",
                 "index.service_managed=false", f"index.service_port={port}",
                 f"index.service_url={url}", "index.client_retries=1",
                 "index.client_backoff_s=0.05"]
    saved = os.environ.pop(TOKEN_ENV, None)
    # Nothing serves yet: the flow builds the index, then fails its service check.
    first = pipeline(config_path="configs/tiny.yaml", overrides=overrides, return_state=True)
    assert first.is_failed()
    servers: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        servers.append(_start_server(tmp / "work" / "build_index", port, tmp / "server.log"))
        return servers[-1]

    try:
        yield {"tmp": tmp, "url": url, "overrides": overrides,
               "paths": StagePaths(tmp / "work"), "start": start}
    finally:
        for proc in servers:
            _kill(proc)
        if saved is not None:
            os.environ[TOKEN_ENV] = saved


def _killing_first(real: Callable[..., Any], proc: subprocess.Popen[bytes]
                   ) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        _kill(proc)  # the retriever dies as the stage starts
        return real(*args, **kwargs)

    return wrapped


def _registered_models(tracking_uri: str) -> list[Any]:
    from mlflow import MlflowClient

    return list(MlflowClient(tracking_uri).search_registered_models())


def test_a_dead_retriever_fails_the_flow_caches_nothing_and_decides_nothing(
        setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    paths: StagePaths = setup["paths"]
    server = setup["start"]()
    with monkeypatch.context() as patch:
        patch.setattr(stages, "evaluate_policy", _killing_first(stages.evaluate_policy, server))
        state = pipeline(config_path="configs/tiny.yaml", overrides=setup["overrides"],
                         return_state=True)
    assert state.is_failed()
    exc = state.result(raise_on_failure=False)
    assert type(exc).__name__ == "RetrieverFailedError", repr(exc)
    assert setup["url"] in str(exc) and "search calls failed" in str(exc)
    assert not (paths.eval_dir / "results.json").exists()
    assert not (paths.gate_dir / "decision.json").exists()
    assert not list(paths.gate_dir.glob("report*"))
    uri = f"sqlite:///{setup['tmp'] / 'mlflow.db'}"
    assert _registered_models(uri) == []

    # The CLI: the same failure (the stage cached nothing, so it runs and fails again) exits 7
    # with the message alone.
    server = setup["start"]()
    with monkeypatch.context() as patch:
        patch.setattr(stages, "evaluate_policy", _killing_first(stages.evaluate_policy, server))
        assert pipeline_module.main(["--config", "configs/tiny.yaml", *setup["overrides"]]) == 7
    err = capsys.readouterr().err
    assert setup["url"] in err and "search calls failed" in err and "Traceback" not in err

    # A live retriever again: the failed stage and the gate run for real, upstream is reused.
    setup["start"]()
    result = pipeline(config_path="configs/tiny.yaml", overrides=setup["overrides"])
    ran = {c["stage"] for c in child_runs(result["tracking_uri"], result["parent_run_id"])}
    assert ran == {"evaluate_policy", "decide_go_no_go"}
    assert (paths.eval_dir / "results.json").is_file()
    assert Path(result["decision"].report_html).is_file()
