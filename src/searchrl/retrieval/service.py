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

`ManagedServer` is the same server as an object (`start`, `exit_code`, `stop`), which
`searchrl.retrieval.provider.SearcherProvider` starts lazily for the flow and restarts once
when it dies.
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
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from searchrl.config import IndexConfig
from searchrl.datasets.io import log_tail

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


def _save_stats(url: str, token: str, path: Path, extra: dict[str, Any] | None = None) -> None:
    """The server's /stats (and `extra`) into `path`, best effort: a dead server must not
    mask the error that is leaving the block."""
    try:
        resp = httpx.get(f"{url}/stats", timeout=5.0,
                         headers={"Authorization": f"Bearer {token}"})
        resp.raise_for_status()
        stats = resp.json()
        path.write_text(json.dumps({**stats, **(extra or {})}, indent=2))
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


class ManagedServer:
    """`python -m searchrl.retrieval.server` over one index as a subprocess: `start`, `alive`,
    `restart`, `stop`. The token is fixed for its life, so clients survive a restart."""

    def __init__(self, index_dir: str | Path, config: IndexConfig, token: str, log_dir: Path,
                 config_path: Path, *, corpus: str | None = None,
                 server_args: Sequence[str] = (), python: str = sys.executable) -> None:
        self.config = config
        self.token = token
        self.log_path = log_dir / "server.log"
        self.stats_path = log_dir / "stats.json"
        self.local_url = IndexConfig.url_for(config.service_host, config.service_port)
        # Only the index section: it is all the server reads, and the file holds no secret.
        config_path.write_text(yaml.safe_dump({"index": config.model_dump(mode="json")}))
        self._cmd = [python, "-m", "searchrl.retrieval.server", "--index-dir",
                     str(Path(index_dir).resolve()), "--config", str(config_path), "--host",
                     config.service_host, "--port", str(config.service_port),
                     "--no-access-log", "--exit-with-parent", *server_args]
        if corpus is not None:
            self._cmd += ["--corpus", corpus]
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # set by whoever restarts it; saved with its stats

    def start(self) -> None:
        """Start it and wait for its /health (ServiceError with the log tail if it exits or
        never answers, or the port is taken)."""
        check_port_free(self.config.service_host, self.config.service_port)
        env = {**os.environ, self.config.service_token_env: self.token}
        with self.log_path.open("ab") as log:  # a restart appends: the first death stays
            self.proc = subprocess.Popen(self._cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        try:
            _wait_healthy(self.proc, self.local_url, self.token,
                          self.config.service_start_timeout_s, self.log_path)
        except BaseException:
            _stop(self.proc, self.config.service_stop_grace_s)
            raise
        logger.info("retrieval server pid %d serving %s (log %s)", self.proc.pid,
                    self.config.service_url, self.log_path)

    def exit_code(self) -> int | None:
        """The exit status once the process has ended; None while it runs (or never ran)."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        """Save its /stats next to its log (best effort), then SIGTERM, SIGKILL after the
        grace period."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _save_stats(self.local_url, self.token, self.stats_path,
                        {"restarts": self.restarts})
        _stop(self.proc, self.config.service_stop_grace_s)


@contextlib.contextmanager
def managed_server(index_dir: str | Path, config: IndexConfig, *, corpus: str | None = None,
                   log_dir: str | Path | None = None, server_args: Sequence[str] = (),
                   python: str = sys.executable) -> Iterator[ManagedServer]:
    """A started `ManagedServer` for the block (see `serve_index`), stopped after."""
    token = os.environ.get(config.service_token_env) or None
    own_token = token is None
    token = token or secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="searchrl-retriever-") as tmp:
        logs = Path(log_dir) if log_dir is not None else Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        server = ManagedServer(index_dir, config, token, logs, Path(tmp) / "index.yaml",
                               corpus=corpus, server_args=server_args, python=python)
        try:
            server.start()
            with contextlib.ExitStack() as stack:
                if own_token:
                    stack.enter_context(_env_var(config.service_token_env, token))
                yield server
        finally:
            server.stop()


@contextlib.contextmanager
def serve_index(index_dir: str | Path, config: IndexConfig, *, corpus: str | None = None,
                log_dir: str | Path | None = None, server_args: Sequence[str] = (),
                python: str = sys.executable) -> Iterator[str]:
    """Run `python -m searchrl.retrieval.server` over `index_dir` (a build_index stage
    directory or one corpus directory) with `config` for the block; yields its URL
    (`config.service_url`). `log_dir` keeps server.log and stats.json (default: a temporary
    directory, gone after). `server_args`: extra server flags (e.g. `--serialise`)."""
    with managed_server(index_dir, config, corpus=corpus, log_dir=log_dir,
                        server_args=server_args, python=python):
        yield config.service_url


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
    saying how to start one, when it does not answer, or naming the token's setting when it
    refuses this process's token."""
    from searchrl.retrieval.base import SearchError
    from searchrl.retrieval.client import RetrievalClient

    check_service_token(config)  # a refused token says so, not "no service answers"
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


def check_service_token(config: IndexConfig) -> None:
    """ServiceError, naming `index.service_token_env`, when the external service (`index.mode:
    service`, `service_managed: false`) answers but refuses this process's token. Checked at
    a run's start, so a wrong token fails there and not after indexing; a service that does
    not answer yet is left to `check_service` before the first search."""
    if config.mode != "service" or config.service_managed:
        return
    from searchrl.retrieval.client import token_hint

    token = os.environ.get(config.service_token_env)
    try:  # /limits is behind the token; /health answers liveness without one
        resp = httpx.get(f"{config.service_url}/limits", timeout=config.client_timeout_s,
                         headers={"Authorization": f"Bearer {token}"} if token else {})
    except httpx.HTTPError:
        return
    if resp.status_code in (401, 403):
        raise ServiceError(f"the retrieval service at {config.service_url} refused this run's "
                           f"token (HTTP {resp.status_code}){token_hint(config)}")
