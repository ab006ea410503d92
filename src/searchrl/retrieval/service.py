"""The retrieval server as a subprocess for the length of a `with` block.

    with serve_index(index_dir, config.index, log_dir=work_dir / "retrieval_service") as url:
        ...  # load_searcher(index_dir, config.index) is an HTTP client of `url`

The server listens on the configured `service_host:service_port`, which the config validates
to be `service_url`: clients find it from the same config the stages already get, and the
stage cache keys (which include the index section) stay the same from run to run. The port
must be free (else a clear error: another server may still hold it). The bearer token comes
from `$<service_token_env>`; when unset, a random one is made for this block and set in this
process's environment (for in-process clients and the subprocesses they start, e.g.
DeepSpeed ranks) and the server's, and removed again after.

Starting waits (bounded by `service_start_timeout_s`) until `/health` answers from this very
process (its pid); a server that exits or never answers raises `ServiceError` with the last
lines of its log. Leaving the block, normally or by an exception, saves the server's /stats
next to its log, then stops it: SIGTERM, SIGKILL after `service_stop_grace_s`. The server
also stops by itself when this process dies (`--exit-with-parent`).

`retrieval_service(config, index_dir)` is what the flow uses: the managed server, a health
check of an external one (`service_managed: false`), or nothing for `mode: inprocess`. The
managed server starts when the first stage inside the block asks for a searcher
(`start_pending_service`, called by `load_searcher` and before launching DeepSpeed ranks), so
a re-run whose searching stages all come from cache never loads the index.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from searchrl.config import IndexConfig, PipelineConfig
from searchrl.data.io import log_tail

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 30


class ServiceError(RuntimeError):
    """The retrieval service could not be started, reached or stopped; the message says why."""


def check_port_free(host: str, port: int) -> None:
    """ServiceError if something listens on host:port (SO_REUSEADDR as uvicorn binds, so a
    port with only TIME_WAIT connections left counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServiceError(
                f"cannot serve the retriever on {host}:{port}: {exc.strerror or exc} (a "
                f"retrieval server left running? `ss -ltnp 'sport = :{port}'` shows the "
                "owner); stop it, or set index.service_port and index.service_url to a free "
                "port") from exc


def _health(url: str, token: str, timeout_s: float) -> dict[str, Any] | None:
    """The /health answer (with the token: its details, the pid among them), or None."""
    try:
        resp = httpx.get(f"{url}/health", timeout=timeout_s,
                         headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _stop(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        logger.warning("retrieval server pid %d ignored SIGTERM for %.0fs; killing it",
                       proc.pid, grace_s)
        proc.kill()
        proc.wait(timeout=30)


def _save_stats(url: str, token: str, path: Path) -> None:
    """The server's /stats into `path`, best effort: a dead server must not mask the error
    that is leaving the block."""
    try:
        resp = httpx.get(f"{url}/stats", timeout=5.0,
                         headers={"Authorization": f"Bearer {token}"})
        resp.raise_for_status()
        stats = resp.json()
        path.write_text(json.dumps(stats, indent=2))
        totals = stats.get("totals", {})
        logger.info("retrieval service: %s requests, %s queries from %d clients; flagged %s",
                    totals.get("requests"), totals.get("queries"),
                    len(stats.get("clients", {})), totals.get("flagged"))
    except (httpx.HTTPError, ValueError, OSError) as exc:
        logger.warning("retrieval service stats not saved: %s", exc)


@contextlib.contextmanager
def _env_var(name: str, value: str) -> Iterator[None]:
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


@contextlib.contextmanager
def serve_index(index_dir: str | Path, config: IndexConfig, *, corpus: str | None = None,
                log_dir: str | Path | None = None, server_args: Sequence[str] = (),
                python: str = sys.executable) -> Iterator[str]:
    """Run `python -m searchrl.retrieval.server` over `index_dir` (a build_index stage
    directory or one corpus directory) with `config` for the block; yields its URL
    (`config.service_url`). `log_dir` keeps server.log and stats.json (default: a temporary
    directory, gone after). `server_args`: extra server flags (e.g. `--serialise`)."""
    host, port = config.service_host, config.service_port
    local_url = IndexConfig.url_for(host, port)
    check_port_free(host, port)
    token = os.environ.get(config.service_token_env) or None
    own_token = token is None
    token = token or secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="searchrl-retriever-") as tmp:
        logs = Path(log_dir) if log_dir is not None else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / "server.log"
        # Only the index section: it is all the server reads, and the file holds no secret.
        config_path = Path(tmp) / "index.yaml"
        config_path.write_text(yaml.safe_dump({"index": config.model_dump(mode="json")}))
        cmd = [python, "-m", "searchrl.retrieval.server", "--index-dir",
               str(Path(index_dir).resolve()), "--config", str(config_path), "--host", host,
               "--port", str(port), "--no-access-log", "--exit-with-parent", *server_args]
        if corpus is not None:
            cmd += ["--corpus", corpus]
        env = {**os.environ, config.service_token_env: token}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env)
        try:
            _wait_healthy(proc, local_url, token, config.service_start_timeout_s, log_path)
            logger.info("retrieval server pid %d serving %s (log %s)", proc.pid,
                        config.service_url, log_path)
            with contextlib.ExitStack() as stack:
                if own_token:
                    stack.enter_context(_env_var(config.service_token_env, token))
                yield config.service_url
        finally:
            if proc.poll() is None:
                _save_stats(local_url, token, logs / "stats.json")
            _stop(proc, config.service_stop_grace_s)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, token: str, timeout_s: float,
                  log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            tail = log_tail(log_path, LOG_TAIL_LINES)
            raise ServiceError(f"the retrieval server exited with code {code} before answering "
                               f"{url}/health; last lines of {log_path}:\n{tail}")
        health = _health(url, token, timeout_s=2.0)
        # The pid check: an answer from another server on this port is not ours.
        if health is not None and health.get("pid") == proc.pid:
            return
        if time.monotonic() > deadline:
            tail = log_tail(log_path, LOG_TAIL_LINES)
            raise ServiceError(f"the retrieval server did not answer {url}/health within "
                               f"{timeout_s:.0f}s (raise index.service_start_timeout_s for a "
                               f"large index); last lines of {log_path}:\n{tail}")
        time.sleep(0.2)


def check_service(config: IndexConfig) -> dict[str, Any]:
    """The /health answer of the external service at `config.service_url`; ServiceError,
    saying how to start one, when it does not answer."""
    from searchrl.retrieval.base import SearchError
    from searchrl.retrieval.client import RetrievalClient

    client = RetrievalClient.from_config(config)
    try:
        return client.health()
    except SearchError as exc:
        raise ServiceError(
            f"index.mode=service with service_managed=false, but no retrieval service answers "
            f"at {config.service_url}: {exc}. Start it (`python -m searchrl.retrieval.server "
            "--index-dir <work_dir>/build_index --config <config>`) or set "
            "index.service_managed=true to let the pipeline run it") from exc
    finally:
        client.close()


# The managed server a `retrieval_service` block will start for the first stage that searches.
_pending: Callable[[], object] | None = None
_pending_lock = threading.Lock()


def start_pending_service() -> None:
    """Start the managed retrieval server of the enclosing `retrieval_service` block, if it
    has not started yet; nothing otherwise (outside a block, or already running)."""
    global _pending
    with _pending_lock:
        start, _pending = _pending, None
    if start is not None:
        start()


@contextlib.contextmanager
def retrieval_service(config: PipelineConfig, index_dir: str | Path) -> Iterator[str | None]:
    """What the searching stages need around them: the managed server (`index.mode:
    service`, started by the first stage that searches), a checked external one
    (`service_managed: false`), or nothing (yields None)."""
    global _pending
    index = config.index
    if index.mode != "service":
        yield None
    elif not index.service_managed:
        check_service(index)
        yield index.service_url
    else:
        log_dir = Path(config.run.work_dir) / "retrieval_service"
        with contextlib.ExitStack() as running:
            with _pending_lock:
                _pending = lambda: running.enter_context(  # noqa: E731
                    serve_index(index_dir, index, log_dir=log_dir))
            try:
                yield index.service_url
            finally:
                with _pending_lock:
                    _pending = None
