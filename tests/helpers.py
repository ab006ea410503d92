"""Small pieces several test modules need: a free loopback port, an app served in a thread,
a sink that keeps what it is given, and a tiny saved policy."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import psutil
import uvicorn
from fastapi import FastAPI

from searchrl.config import PipelineConfig
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.sinks import NullSink
from searchrl.train.distributed.deepspeed_setup import free_port

__all__ = ["RecordingSink", "free_port", "save_tiny_policy", "serving"]


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn in a thread on a free loopback port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


class RecordingSink(NullSink):
    """Keeps the metrics logged to it (the last value of each key) and the artifact paths."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.artifacts: list[Path] = []

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.artifacts.append(Path(path))

    def log_metrics(self, metrics: object, step: int | None = None) -> None:
        assert isinstance(metrics, dict)
        self.metrics.update(metrics)


def save_tiny_policy(texts: Iterable[str], out: Path) -> Path:
    """A one-layer random policy with a tokenizer trained on `texts`, saved in `out`."""
    tok = train_tokenizer(list(texts) * 5, vocab_size=300)
    tiny = PipelineConfig().model.tiny.model_copy(update={"n_layer": 1, "n_embd": 32,
                                                          "n_head": 2})
    model = build_tiny_model(tiny, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@cache
def _mlflow_template() -> Path:
    """An MLflow sqlite store with its tables made, once per process: creating them costs
    seconds per store (schema migrations), a copy milliseconds."""
    from mlflow.tracking import MlflowClient

    path = Path(tempfile.mkdtemp(prefix="mlflow-template-")) / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path


def fresh_mlflow_uri(directory: Path) -> str:
    """A new, empty MLflow sqlite store in `directory` (artifacts next to it)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_mlflow_template(), directory / "mlflow.db")
    return f"sqlite:///{directory / 'mlflow.db'}"


def stop_process_group(
    proc: subprocess.Popen[bytes], timeout_s: float = 30
) -> list[psutil.Process]:
    """TERM then KILL the session `proc` leads (started with start_new_session=True); what is
    still alive after. Safe when the leader already died (a server that failed at start: its
    group may be gone, and killpg then raises ProcessLookupError)."""
    group = [p for p in psutil.process_iter() if _in_group(p, proc.pid)]

    def signal_group(sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(signal.SIGKILL)
        proc.wait(timeout=timeout_s)
    _, alive = psutil.wait_procs(group, timeout=timeout_s)
    return list(alive)


def _in_group(p: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(p.pid) == pgid
    except (ProcessLookupError, psutil.Error):
        return False


# The writes a registry change makes through MlflowClient (what a store can fail at).
REGISTRY_WRITES = ("create_registered_model", "create_model_version", "set_model_version_tag",
                   "set_registered_model_alias", "delete_registered_model_alias",
                   "set_registered_model_tag", "delete_registered_model_tag")


@contextlib.contextmanager
def registry_fails_at(k: int | None) -> Iterator[list[str]]:
    """The k-th registry write (1-based; None or 0: none) raises MlflowException, as a store
    that went away would; yields the writes made (their method names), counting every one."""
    import mlflow
    import pytest
    from mlflow import MlflowClient

    made: list[str] = []

    def failing(method: str, real: Any) -> Any:
        def write(self: MlflowClient, *args: Any, **kwargs: Any) -> Any:
            made.append(method)
            if len(made) == k:
                raise mlflow.exceptions.MlflowException(f"injected: {method} failed")
            return real(self, *args, **kwargs)
        return write

    with pytest.MonkeyPatch.context() as patch:
        for method in REGISTRY_WRITES:
            patch.setattr(MlflowClient, method, failing(method, getattr(MlflowClient, method)))
        yield made
