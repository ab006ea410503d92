"""Where the searching stages get their `Searcher`: a `SearcherProvider` its caller owns.

The flow opens one around the stages that search and passes it to each of them (a task
parameter; the stage cache key skips it, as it has no `files`):

    with retrieval_service(config, index.index_dir) as searchers:
        filter_curriculum(..., searchers=searchers)

A stage called without one (the CLI, tests) builds `SearcherProvider(config.index)`: the
in-process index, or a client of the external service (`index.mode: service`).

With a managed service (`index.mode: service`, `service_managed: true`) the provider starts
the server when the first stage asks for a searcher (`searcher`, or `ensure_service` before
launching DeepSpeed ranks), so a re-run whose searching stages all come from cache never
loads the index; it stops it when the block ends. A managed server that dies is restarted
once: a search that fails while the server process has exited restarts it (logged, counted in
`restarts` and in the saved stats.json) and is retried; a second death raises `ServiceError`
naming the service and the tail of its log, which fails the stage (rollouts count only
`SearchError`). Ranks in other processes hold plain clients: their failures count toward the
rollout limit (`RetrieverFailedError`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from searchrl.config import IndexConfig, PipelineConfig
from searchrl.datasets.io import log_tail
from searchrl.retrieval.base import Searcher, SearchError
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.index_store import MAIN_CORPUS, load_searcher
from searchrl.retrieval.service import (
    LOG_TAIL_LINES,
    ManagedServer,
    ServiceError,
    check_service,
    managed_server,
)
from searchrl.types import SearchHit

logger = logging.getLogger(__name__)

MAX_RESTARTS = 1  # a server that dies twice is broken, not unlucky


class SearcherProvider:
    """Searchers for the stages; owns the managed retrieval server, if any (thread-safe)."""

    def __init__(self, config: IndexConfig, *, managed_index_dir: str | Path | None = None,
                 log_dir: str | Path | None = None) -> None:
        """`managed_index_dir`: run the managed server over it (index.mode=service, started
        lazily); None: no server of ours (in-process index, or an external service)."""
        self.config = config
        self._index_dir = managed_index_dir
        self._log_dir = log_dir
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._server: ManagedServer | None = None
        self.generation = 0  # bumped by each (re)start: a failure older than it is retried
        self.restarts = 0

    @property
    def started(self) -> bool:
        return self._server is not None

    def searcher(self, index_dir: str | Path, corpus: str = MAIN_CORPUS) -> Searcher:
        """The Searcher over `index_dir` (see `load_searcher`); with a managed service, a
        client of it that survives one restart of the server."""
        if self.config.mode != "service":
            return load_searcher(Path(index_dir), self.config, corpus)
        self.ensure_service()
        client = RetrievalClient.from_config(self.config)
        return client if self._index_dir is None else _RestartingSearcher(client, self)

    def ensure_service(self) -> None:
        """Start the managed server if it is not running yet; nothing without one."""
        with self._lock:
            if self._index_dir is None or self._server is not None:
                return
            self._server = self._stack.enter_context(
                managed_server(self._index_dir, self.config, log_dir=self._log_dir))
            self.generation += 1

    def recover(self, exc: SearchError, generation: int) -> bool:
        """After a search failed with `exc` (the client started it at `generation`): True
        when it should be retried (the server was restarted, now or since); False when the
        server runs (the failure is the search's own); ServiceError on a second death."""
        with self._lock:
            server = self._server
            if server is None:
                return False
            if generation != self.generation:
                return True
            code = server.exit_code()
            if code is None:
                return False
            tail = log_tail(server.log_path, LOG_TAIL_LINES)
            if self.restarts >= MAX_RESTARTS:
                raise ServiceError(
                    f"the managed retrieval service at {self.config.service_url} died again "
                    f"(exit code {code}) after {self.restarts} restart(s); the stage fails "
                    f"(last search error: {exc}). Last lines of {server.log_path}:\n{tail}"
                ) from exc
            logger.warning("retrieval service at %s died (exit code %s); restarting it once. "
                           "Last lines of %s:\n%s", self.config.service_url, code,
                           server.log_path, tail)
            self.restarts += 1
            server.restarts = self.restarts
            server.start()
            self.generation += 1
            return True

    def close(self) -> None:
        """Stop the managed server (its stats saved first), if it ran."""
        with self._lock:
            self._stack.close()
            self._server = None


class _RestartingSearcher:
    """A client of the managed server that asks its provider to restart a dead server."""

    def __init__(self, client: RetrievalClient, provider: SearcherProvider) -> None:
        self.client = client
        self._provider = provider

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        while True:
            generation = self._provider.generation
            try:
                return self.client.search_batch(queries, top_k)
            except SearchError as exc:
                if not self._provider.recover(exc, generation):
                    raise

    def close(self) -> None:
        self.client.close()


def searchers_for(config: PipelineConfig, searchers: SearcherProvider | None
                  ) -> SearcherProvider:
    """`searchers`, or the caller-less default: in-process, or the external service."""
    return searchers if searchers is not None else SearcherProvider(config.index)


@contextlib.contextmanager
def retrieval_service(config: PipelineConfig, index_dir: str | Path
                      ) -> Iterator[SearcherProvider]:
    """The provider the searching stages share: over the managed server (`index.mode:
    service`, started by the first stage that searches), a checked external one
    (`service_managed: false`), or the in-process index (`mode: inprocess`)."""
    index = config.index
    if index.mode == "service" and not index.service_managed:
        check_service(index)
    managed = index.mode == "service" and index.service_managed
    provider = SearcherProvider(
        index, managed_index_dir=index_dir if managed else None,
        log_dir=Path(config.run.work_dir) / "retrieval_service" if managed else None)
    try:
        yield provider
    finally:
        provider.close()
