"""HTTP client of the retrieval service, as a `Searcher`.

Speaks Search-R1's `/retrieve` shape (`{"queries", "topk", "return_scores"}` ->
`{"result": [[{"document": {"id", "contents", ...}, "score"}, ...], ...]}`), so it also works
against Search-R1's own retrieval server. Batches are split to the server's `search_batch`
(the queries it searches at once) or `max_batch` if smaller, read once from its `/limits` (a
server without that endpoint, like Search-R1's: the client's own `max_batch`, if any). Every
call has a timeout; connection errors, timeouts, 429 (rate
limited) and 5xx (503: busy) are retried a bounded number of times with jittered exponential
backoff, waiting at least the server's Retry-After (capped at the timeout), except a failure
the server marks final (a search that failed or ran past its timeout); then, or on any other
error status or a malformed answer, `SearchError` is raised. Requests carry `X-Client-Id`
(host:pid[:rank]) so the server's /stats can tell ranks apart. A failure is never returned as
an empty result. Hit texts are neutralised (rollout tags escaped).

A document's `contents` is in FlashRAG's (wiki-18's) layout, `"Title"\\ntext`, which
Search-R1's trainer reads (the first line its title). Our server adds that title line to a
passage stored without it (the demo's `Title. text`) and says so (`title_line_added`); the
hit here is the passage as stored, exactly what an in-process search returns. A document
without a `title` (Search-R1's server sends corpus rows as stored) takes it from a `"Title"`
first line, as loading that corpus does (`searchrl.datasets.io`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import httpx

from searchrl.config import IndexConfig
from searchrl.datasets.io import flashrag_title
from searchrl.httpx_helpers import request_json
from searchrl.retrieval.base import SearchError
from searchrl.tags import neutralize_tags
from searchrl.types import SearchHit


class RetrievalClient:
    """`Searcher` over HTTP. Thread-safe (one pooled httpx client)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 10.0,
                 retries: int = 3, backoff_s: float = 0.2,
                 transport: httpx.BaseTransport | None = None,
                 client_id: str | None = None, max_batch: int | None = None,
                 auth_hint: str = "") -> None:
        """`max_batch`: the batch size to split to when the server advertises no limits
        (None: send every batch whole). `auth_hint`: added to the error of a request the
        server refuses with 401/403 (where the token comes from)."""
        self.url = url.rstrip("/")
        self.auth_hint = auth_hint
        self.max_batch = max_batch
        self._limits: dict[str, Any] | None = None
        self._limits_lock = threading.Lock()
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_wait_s = timeout_s
        headers = {"X-Client-Id": client_id or default_client_id()}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers,
                                  transport=transport)

    @classmethod
    def from_config(cls, config: IndexConfig) -> RetrievalClient:
        """Client for `config.service_url`, token from `$<config.service_token_env>` if set."""
        return cls(config.service_url, token=os.environ.get(config.service_token_env) or None,
                   timeout_s=config.client_timeout_s, retries=config.client_retries,
                   backoff_s=config.client_backoff_s,
                   max_batch=min(config.search_batch, config.max_batch),
                   auth_hint=token_hint(config))

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, json: Any = None,
                 absent_ok: bool = False) -> Any:
        return request_json(lambda: self._http.request(method, path, json=json),
                            retries=self.retries, backoff_s=self.backoff_s,
                            max_wait_s=self.max_wait_s, where=f"retrieval service {self.url}{path}",
                            error=SearchError, absent_ok=absent_ok, auth_hint=self.auth_hint,
                            unreachable="is it running? start it with `python -m "
                            "searchrl.retrieval.server --index-dir DIR --config CFG`")

    def limits(self) -> dict[str, Any]:
        """The server's limits (`/limits`: max_batch, max_top_k, max_query_chars,
        max_body_bytes), asked once; {} from a server that has no such endpoint."""
        with self._limits_lock:
            if self._limits is None:
                data = self._request("GET", "/limits", absent_ok=True)
                if data is not None and not isinstance(data, dict):
                    raise SearchError(f"retrieval service {self.url}/limits: unexpected "
                                      f"answer {str(data)[:200]}")
                self._limits = data or {}
            return self._limits

    def _batch_size(self) -> int | None:
        # search_batch: a request of one server-side chunk stays within one search timeout.
        limits = self.limits()
        sizes = []
        for key in ("search_batch", "max_batch"):
            advertised = limits.get(key)
            if advertised is None:
                continue
            if not isinstance(advertised, int) or advertised < 1:
                raise SearchError(f"retrieval service {self.url}/limits: {key} must be a "
                                  f"positive integer, got {advertised!r}")
            sizes.append(advertised)
        return min(sizes) if sizes else self.max_batch

    def health(self) -> dict[str, Any]:
        data = self._request("GET", "/health")
        if not isinstance(data, dict):
            raise SearchError(f"retrieval service {self.url}/health: unexpected answer {data!r}")
        return data

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        """Hits per query, in `max_batch` requests one after another."""
        if not queries:
            return []
        size = self._batch_size() or len(queries)
        hits: list[list[SearchHit]] = []
        for start in range(0, len(queries), size):
            hits.extend(self._retrieve(queries[start:start + size], top_k))
        return hits

    def _retrieve(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        data = self._request("POST", "/retrieve", json={
            "queries": list(queries), "topk": top_k, "return_scores": True})
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise SearchError(f"retrieval service {self.url}/retrieve: expected 'result' with "
                              f"{len(queries)} lists, got {str(data)[:200]}")
        try:
            return [[_hit(item) for item in per_query] for per_query in result]
        except (KeyError, TypeError, ValueError) as exc:
            raise SearchError(f"retrieval service {self.url}/retrieve: malformed hit: {exc}"
                              ) from exc


def _hit(item: dict[str, Any]) -> SearchHit:
    # Neutralised again here (idempotent): the server may be Search-R1's, which does not.
    doc = item["document"]
    title = doc.get("title")
    contents = str(doc["contents"])
    if doc.get(TITLE_LINE_ADDED) is True:
        line = title_line(str(title)) if title else None
        if line is None or not contents.startswith(line):
            raise ValueError(f"document {doc['id']!r} says {TITLE_LINE_ADDED} but its contents "
                             "do not start with its title in quotes")
        contents = contents[len(line):]
    elif title is None:
        title = flashrag_title(contents)
    return SearchHit(doc_id=str(doc["id"]), title=neutralize_tags(str(title)) if title else None,
                     contents=neutralize_tags(contents), score=float(item.get("score", 0.0)))


# --- the document layout on the wire (written by the server, read back above)

TITLE_LINE_ADDED = "title_line_added"


def title_line(title: str) -> str:
    """The first line of FlashRAG's `contents`: the title in double quotes, then a newline.
    Search-R1 splits on the first newline, so a newline inside the title becomes a space."""
    return '"' + title.replace("\n", " ") + '"\n'


def flashrag_contents(title: str | None, contents: str) -> tuple[str, bool]:
    """(`contents` in FlashRAG's layout, whether a title line was added): a titled passage
    that does not already start with its title line gets one; others are left as they are."""
    if not title or contents.startswith(title_line(title)):
        return contents, False
    return title_line(title) + contents, True



def token_hint(config: IndexConfig) -> str:
    """Where this client's token comes from, for an error saying the server refused it."""
    given = "is set" if os.environ.get(config.service_token_env) else "is not set"
    return (f"; the token comes from ${config.service_token_env} (index.service_token_env), "
            f"which {given}: set it to the token the server was started with")


def default_client_id() -> str:
    rank = os.environ.get("RANK")
    return f"{socket.gethostname()}:{os.getpid()}" + (f":rank{rank}" if rank else "")
