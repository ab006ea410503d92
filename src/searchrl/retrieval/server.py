"""The retrieval HTTP service (FastAPI): Search-R1-compatible batch `/retrieve`, `/health`,
`/limits`, `/stats`.

    POST /retrieve {"queries": [str], "topk": int = 3, "return_scores": bool = false}
      -> {"result": [[{"document": {"id", "title", "contents"}, "score": float}, ...], ...]}
         (with return_scores=false each hit is the bare document, as in Search-R1)
    GET  /health  -> {"status": "ok"}; with the token also "passages", "retriever", "pid";
                     a wrong token 401 (so a client finds a bad token up front)
    GET  /limits  -> {"max_batch", "search_batch", "max_top_k", "max_query_chars",
                      "max_body_bytes"} (our client sends search_batch queries a request)
    GET  /stats   -> per-client request/query counts, flagged queries, a recent-query sample

As Search-R1's trainer calls it: it posts every active rollout's query in one request
(thousands in a training batch), so up to `max_batch` (default 8192) queries are taken in one
request and searched `search_batch` (256) at a time, one chunk after another (the search
timeout is per chunk); and it takes a hit's title as the first line of `document.contents`
(FlashRAG's wiki-18 layout, `"Title"\\ntext`), so `contents` is written so: a passage
stored without that line (the demo's `Title. text`) gets it, marked `title_line_added` for
our client (`retrieval/client.py`), which returns the passage as stored. Latency of one
request of 400 / 1000 / 4096 queries: benchmarks/bench_search_r1_batch.py.

When a token is set, every path but /health needs it, checked before the body is read: a
missing/wrong bearer token answers 401, a body above `max_body_bytes` (room for the largest
valid request) 413, neither reading the rest. Then the rate limit (more than
`service_rate_limit_per_s` requests/s from one client: 429 with Retry-After), before the body
is parsed. Limits (from `IndexConfig`) answer with a clear 4xx, checked cheapest first so a
malformed body costs little (a 3 MB list of integers: 0.2 s, was 52.7 s and 1.4 GB;
benchmarks/bench_bad_body.py): batch above `max_batch` 413 before any query is looked at;
not JSON, a wrong shape, an empty batch, bad top-k, an overlong query or one that is not
valid Unicode (a lone surrogate) 422, its detail naming at most a few fields and never
echoing the input. More than
`service_max_inflight` requests admitted at once, or one that waited a whole
`service_search_timeout_s` for a worker, answer 503 "busy" with Retry-After, so clients
retry. A search that fails answers 500, one that runs past `service_search_timeout_s` 504,
both marked final (`X-No-Retry`): the same request would fail again. Bound to 127.0.0.1
unless told otherwise; a non-loopback bind without a token is refused.

Concurrency: up to `service_workers` searches run at once on a thread pool; nothing
serialises them except what is not thread-safe. BM25 search only reads the index's arrays
(each call scores into its own array) and the tokenizer's vocabulary (no stemmer,
update_vocab=False, so tokenising writes nothing); faiss CPU indexes are thread-safe for
concurrent searches (faiss wiki, "Threads and asynchronous calls") and release the GIL; torch
inference releases the GIL. Not safe: a Hugging Face fast tokenizer called from two threads
can raise "Already borrowed" (huggingface/tokenizers#537, transformers#47085: the Python
side re-sets truncation and padding on the shared Rust object; version dependent), so query
*encoding* takes a lock, which costs little: on CPU torch already spreads one encode over
every core; and faiss GPU indexes are not thread-safe even for search, so a GPU-backed
searcher runs one search at a time. On a small index most of a request is Python (HTTP,
tokenising, hit objects) under the GIL, so threads add little there
(benchmarks/bench_service.py); they pay where the numpy / faiss work on a large index releases
it, and keep a large batch from holding up everyone else.

    python -m searchrl.retrieval.server --index-dir runs/tiny/build_index --config configs/tiny.yaml

Over 400 lines because the request path (auth, size, rate, limits, admission, search, timeout)
is one order, checked cheapest first, read top to bottom.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from searchrl.config import ConfigError, IndexConfig, load_config
from searchrl.datasets.io import read_manifest
from searchrl.exit_codes import exit_code_table, report_error
from searchrl.httpx_helpers import NO_RETRY_HEADER
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.client import TITLE_LINE_ADDED, flashrag_contents
from searchrl.retrieval.dense import Encoder, FloatArray
from searchrl.retrieval.index_store import (
    MAIN_CORPUS,
    LocalSearcher,
    load_corpus_searcher,
    resolve_corpus,
)
from searchrl.tags import TAG_LIKE
from searchrl.types import SearchHit

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 3  # Search-R1's retriever default
# Policy search queries are a few words; hundreds of characters usually mean the policy is
# pasting passages (or a prompt injection) back into the search box.
LONG_QUERY_CHARS = 300
MARKUP = re.compile(r"<\s*/?\s*[A-Za-z][^<>]{0,40}>")
RECENT_QUERIES = 100
# Clients tracked one by one; further identities share one entry (and one rate bucket), so a
# client inventing X-Client-Id values cannot grow memory.
MAX_CLIENTS = 256
OTHER_CLIENTS = "(other)"
_CLIENT_ID = re.compile(r"[^\w.:@/-]")


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int = DEFAULT_TOP_K
    return_scores: bool = False


class RetrieveResponse(BaseModel):
    result: list[list[dict[str, Any]]] = Field(default_factory=list)


def _document(hit: SearchHit) -> dict[str, Any]:
    """The hit as Search-R1's trainer reads it: `contents` in FlashRAG's `"Title"\\ntext`
    layout (its first line the title), `title_line_added` when the server added that line,
    so our client can return the passage as stored."""
    contents, added = flashrag_contents(hit.title, hit.contents)
    doc: dict[str, Any] = {"id": hit.doc_id, "title": hit.title, "contents": contents}
    if added:
        doc[TITLE_LINE_ADDED] = True
    return doc


# --- monitoring and rate limits (touched only from the event loop thread: no locks)


def query_flags(query: str) -> list[str]:
    """Why a query looks anomalous: "empty", "long", "markup" (tag-like text)."""
    flags = []
    if not query.strip():
        flags.append("empty")
    if len(query) > LONG_QUERY_CHARS:
        flags.append("long")
    if TAG_LIKE.search(query) or MARKUP.search(query):
        flags.append("markup")
    return flags


@dataclass
class ClientStats:
    """Counts for one client. `requests` counts every authorised POST; `queries` those of
    served requests."""

    requests: int = 0
    served: int = 0
    queries: int = 0
    rate_limited: int = 0
    busy: int = 0
    rejected: int = 0
    failed: int = 0
    timed_out: int = 0
    largest_batch: int = 0  # queries in its largest served request
    flagged: dict[str, int] = field(default_factory=dict)
    last_seen: float = 0.0


@dataclass
class TokenBucket:
    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """0.0 and one token spent if one is available, else the seconds until there is."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class Monitor:
    """Per-client counts, flagged-query counts, a bounded recent-query sample, rate buckets."""

    def __init__(self, config: IndexConfig) -> None:
        self.config = config
        self.started = time.time()
        self.clients: dict[str, ClientStats] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_QUERIES)
        self.unauthorized = 0
        self.inflight = 0

    def identify(self, address: str, declared: str | None) -> str:
        """The address, plus the client's own X-Client-Id (host:pid[:rank]) when it sends one:
        ranks on one host share an address. Unknown identities past MAX_CLIENTS are pooled."""
        name = address if not declared else f"{address}/{_CLIENT_ID.sub('_', declared)[:64]}"
        if name not in self.clients and len(self.clients) >= MAX_CLIENTS:
            name = OTHER_CLIENTS
        stats = self.clients.setdefault(name, ClientStats())
        stats.last_seen = time.time()
        return name

    def admit(self, client: str) -> float:
        """0.0 when `client` is within its rate limit, else seconds to wait."""
        rate = self.config.service_rate_limit_per_s
        if rate <= 0:
            return 0.0
        now = time.monotonic()
        burst = float(self.config.service_rate_burst)
        bucket = self.buckets.setdefault(client, TokenBucket(rate, burst, burst, now))
        return bucket.take(now)

    def record_queries(self, client: str, queries: Sequence[str]) -> None:
        stats = self.clients[client]
        now = time.time()
        for query in queries:
            flags = query_flags(query)
            for flag in flags:
                stats.flagged[flag] = stats.flagged.get(flag, 0) + 1
            self.recent.append({"time": round(now, 3), "client": client,
                                "query": query[:200], "flags": flags})

    def snapshot(self) -> dict[str, Any]:
        clients = {name: asdict(s) for name, s in self.clients.items()}
        totals: dict[str, Any] = {key: sum(c[key] for c in clients.values())
                                  for key in ("requests", "served", "queries", "rate_limited",
                                              "busy", "rejected", "failed", "timed_out")}
        flagged: dict[str, int] = {}
        for c in clients.values():
            for flag, n in c["flagged"].items():
                flagged[flag] = flagged.get(flag, 0) + n
        totals["largest_batch"] = max((c["largest_batch"] for c in clients.values()), default=0)
        return {"uptime_s": round(time.time() - self.started, 1), "inflight": self.inflight,
                "limits": {"workers": self.config.service_workers,
                           "max_inflight": self.config.service_max_inflight,
                           "rate_limit_per_s": self.config.service_rate_limit_per_s,
                           "rate_burst": self.config.service_rate_burst,
                           "search_timeout_s": self.config.service_search_timeout_s},
                "totals": totals | {"flagged": flagged, "unauthorized": self.unauthorized},
                "clients": clients, "recent": list(self.recent)}


# --- the app


def max_body_bytes(config: IndexConfig) -> int:
    """The largest request body accepted: room for the largest valid request (`max_batch`
    queries of `max_query_chars` characters, each escaped as a 12-byte JSON surrogate pair,
    plus quotes and keys). Anything larger is refused unread (413)."""
    return 1024 + config.max_batch * (12 * config.max_query_chars + 8)


def _token_ok(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


async def _refuse(send: Send, status: int, detail: str, headers: dict[str, str]) -> None:
    """Answer without reading the body; `Connection: close` so the server drops the rest."""
    response = JSONResponse({"detail": detail}, status_code=status,
                            headers={**headers, "Connection": "close"})
    await response({"type": "http"}, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class _Guard:
    """In front of every route, before a byte of the body is read (FastAPI reads and parses
    the body before a route's dependencies run): the bearer token (401; /health needs none,
    it answers liveness only), then the body size (413 on a Content-Length above the cap; a
    body without one is read up to the cap, then refused)."""

    def __init__(self, app: ASGIApp, token: str | None, max_body: int,
                 monitor: Monitor) -> None:
        self.app, self.token, self.max_body, self.monitor = app, token, max_body, monitor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if (self.token is not None and scope["path"] != "/health"
                and not _token_ok(headers.get("authorization"), self.token)):
            self.monitor.unauthorized += 1
            await _refuse(send, 401, "missing or invalid bearer token (send 'Authorization: "
                          "Bearer <token>')", {"WWW-Authenticate": "Bearer"})
            return
        too_large = (f"request body above max_body_bytes={self.max_body} (index.max_batch x "
                     "index.max_query_chars); split the batch")
        length = headers.get("content-length")
        if length is not None or scope["method"] in ("GET", "HEAD"):
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                await _refuse(send, 413, too_large, {})
                return
            await self.app(scope, receive, send)
            return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                await _refuse(send, 413, too_large, {})
                return

        async def replay() -> Message:
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


class _Searches:
    """Runs searches on the worker pool: the in-flight bound (503 busy), the search timeout
    (504; 503 busy if the search never got a worker), failures (500, final: the client does
    not retry a search that failed, it would fail again)."""

    def __init__(self, searcher: Searcher, config: IndexConfig, monitor: Monitor,
                 serialise: bool) -> None:
        self.searcher, self.config, self.monitor = searcher, config, monitor
        # Threads are made on demand and kept: a search waits for a free one, never a lock.
        self.pool = ThreadPoolExecutor(max_workers=config.service_workers,
                                       thread_name_prefix="retriever")
        self.lock = threading.Lock() if serialise else None

    def _search(self, queries: list[str], top_k: int) -> list[list[SearchHit]]:
        if self.lock is None:
            return self.searcher.search_batch(queries, top_k)
        with self.lock:
            return self.searcher.search_batch(queries, top_k)

    def _release(self) -> None:
        self.monitor.inflight -= 1

    async def run(self, queries: list[str], top_k: int,
                  stats: ClientStats) -> list[list[SearchHit]]:
        """Hits per query: `queries` searched `search_batch` at a time, one chunk after
        another, each on the pool within the search timeout. The request holds one in-flight
        slot until its last search ends."""
        monitor, config = self.monitor, self.config
        if monitor.inflight >= config.service_max_inflight:
            stats.busy += 1
            raise HTTPException(status_code=503, headers={"Retry-After": "1"},
                                detail=f"busy: {monitor.inflight} requests in flight "
                                f"(index.service_max_inflight={config.service_max_inflight}); "
                                "retry")
        monitor.inflight += 1
        future: Future[list[list[SearchHit]]] | None = None
        try:
            hits: list[list[SearchHit]] = []
            for start in range(0, len(queries), config.search_batch):
                chunk = queries[start:start + config.search_batch]
                future = self.pool.submit(self._search, chunk, top_k)
                hits.extend(await self._wait(future, len(chunk), len(queries), stats))
            return hits
        finally:
            if future is None or future.done():
                self._release()
            else:  # a search past its timeout keeps its thread until it ends, and the slot
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release))

    async def _wait(self, future: Future[list[list[SearchHit]]], size: int, total: int,
                    stats: ClientStats) -> list[list[SearchHit]]:
        """One chunk's hits; 503 if it waited the whole timeout for a worker (it never runs),
        504 if it ran past it, 500 if it failed."""
        timeout = self.config.service_search_timeout_s
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            if future.cancel() or future.cancelled():  # still queued: it never ran
                stats.busy += 1
                raise HTTPException(status_code=503, headers={"Retry-After": "1"},
                                    detail=f"busy: waited {timeout:g}s for a free worker "
                                    f"(index.service_workers={self.config.service_workers}); "
                                    "retry") from None
            stats.timed_out += 1
            part = f" (of a request of {total})" if total > size else ""
            raise HTTPException(status_code=504, headers={NO_RETRY_HEADER: "1"},
                                detail=f"search of {size} queries{part} took longer than "
                                f"index.service_search_timeout_s={timeout:g}s") from None
        except Exception as exc:
            stats.failed += 1
            logger.exception("search of %d queries (of %d) failed", size, total)
            raise HTTPException(status_code=500, headers={NO_RETRY_HEADER: "1"},
                                detail=f"search failed: {exc}") from exc


def _add_info_routes(app: FastAPI, monitor: Monitor, config: IndexConfig, token: str | None,
                     info: dict[str, Any]) -> None:
    """/health (details only with the token), /limits and /stats (behind `_Guard`)."""

    @app.get("/health")
    async def health(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        if token is None:
            return {"status": "ok", **info}
        if authorization is None:  # liveness for anyone; details only with the token
            return {"status": "ok"}
        if not _token_ok(authorization, token):
            monitor.unauthorized += 1
            raise HTTPException(status_code=401, headers={"WWW-Authenticate": "Bearer"},
                                detail="wrong bearer token: the client's token is not this "
                                "server's")
        return {"status": "ok", **info}

    @app.get("/limits")
    async def limits() -> dict[str, int]:
        return {"max_batch": config.max_batch, "search_batch": config.search_batch,
                "max_top_k": config.max_top_k, "max_query_chars": config.max_query_chars,
                "max_body_bytes": max_body_bytes(config)}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return monitor.snapshot()


def _add_retrieve_route(app: FastAPI, searches: _Searches, monitor: Monitor,
                        config: IndexConfig) -> None:
    # The body is parsed here, after the rate limit, not by FastAPI before the route runs.
    @app.post("/retrieve")
    async def retrieve(http: Request,
                       x_client_id: Annotated[str | None, Header()] = None) -> RetrieveResponse:
        client = monitor.identify(http.client.host if http.client else "unknown", x_client_id)
        stats = monitor.clients[client]
        stats.requests += 1
        wait = monitor.admit(client)
        if wait > 0:
            stats.rate_limited += 1
            raise HTTPException(status_code=429, headers={"Retry-After": str(math.ceil(wait))},
                                detail=f"rate limit of {config.service_rate_limit_per_s:g} "
                                f"requests/s per client exceeded (burst "
                                f"{config.service_rate_burst}); retry after {wait:.2f}s")
        try:
            request = parse_request(await http.body(), config)
        except HTTPException:
            stats.rejected += 1
            raise
        monitor.record_queries(client, request.queries)
        hits = await searches.run(request.queries, request.topk, stats)
        stats.served += 1
        stats.queries += len(request.queries)
        stats.largest_batch = max(stats.largest_batch, len(request.queries))
        if request.return_scores:
            return RetrieveResponse(result=[[{"document": _document(h), "score": h.score}
                                             for h in per_query] for per_query in hits])
        return RetrieveResponse(result=[[_document(h) for h in per_query] for per_query in hits])


def create_app(searcher: Searcher, config: IndexConfig, token: str | None = None,
               info: dict[str, Any] | None = None, serialise: bool = False) -> FastAPI:
    """An app serving `searcher`. `token`: required bearer token, None for none.
    `info` is merged into the /health answer to holders of the token. `serialise`: one search
    at a time (for a searcher that is not thread-safe, e.g. faiss on GPU; and to measure what
    concurrency buys)."""
    app = FastAPI(title="searchrl retrieval", version="3")
    monitor = Monitor(config)
    app.state.monitor = monitor
    app.add_middleware(_Guard, token=token, max_body=max_body_bytes(config), monitor=monitor)
    _add_info_routes(app, monitor, config, token, info or {})
    _add_retrieve_route(app, _Searches(searcher, config, monitor, serialise), monitor, config)
    return app


MAX_ERRORS_SHOWN = 3


def parse_request(body: bytes, config: IndexConfig) -> RetrieveRequest:
    """The request in `body`, or an HTTPException whose detail is a few lines at most: the
    batch size is checked before any query is validated (a huge list of wrong items would
    otherwise make one error, echoing its input, per item)."""
    try:
        data = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise HTTPException(status_code=422, detail=f"the body is not JSON: {str(exc)[:120]}"
                            ) from None
    queries = data.get("queries") if isinstance(data, dict) else None
    if isinstance(queries, list) and len(queries) > config.max_batch:
        raise HTTPException(status_code=413, detail=f"batch of {len(queries)} queries exceeds "
                            f"max_batch={config.max_batch} queries per request "
                            "(index.max_batch): split it into requests of at most that many, "
                            "or start the server with a larger index.max_batch")
    try:
        request = RetrieveRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        shown = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                          for e in errors[:MAX_ERRORS_SHOWN])
        hidden = len(errors) - MAX_ERRORS_SHOWN
        more = f" (and {hidden} more)" if hidden > 0 else ""
        raise HTTPException(status_code=422, detail=f"{shown}{more}") from None
    _validate(request, config)
    return request


def _validate(request: RetrieveRequest, config: IndexConfig) -> None:
    if not request.queries:
        raise HTTPException(status_code=422, detail="queries must be a non-empty list")
    if not 1 <= request.topk <= config.max_top_k:
        raise HTTPException(status_code=422, detail=f"topk={request.topk} must be between "
                            f"1 and max_top_k={config.max_top_k}")
    for i, query in enumerate(request.queries):
        if len(query) > config.max_query_chars:
            raise HTTPException(status_code=422, detail=f"queries[{i}] has {len(query)} "
                                f"characters, above max_query_chars={config.max_query_chars}")
        try:
            query.encode()
        except UnicodeEncodeError as exc:  # JSON allows "\ud800"; no text encoding does
            raise HTTPException(status_code=422, detail=f"queries[{i}] is not valid Unicode "
                                f"text: {exc.reason} at character {exc.start}") from None


# --- loading and serving


class _SerialEncoder(Encoder):
    """Query encoding one call at a time: the fast tokenizer inside is not thread-safe (see
    the module docstring); the faiss search after it runs concurrently."""

    def __init__(self, config: IndexConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()

    def encode_queries(self, queries: Sequence[str]) -> FloatArray:
        with self._lock:
            return super().encode_queries(queries)


def load_service_searcher(corpus_dir: Path, config: IndexConfig) -> tuple[LocalSearcher, bool]:
    """(a searcher safe to call from several threads, whether it must run serialised
    because its faiss index is on a GPU)."""
    manifest = read_manifest(corpus_dir, directory=True) or {}
    dense = "dense" in manifest.get("retrievers", ())
    searcher = load_corpus_searcher(corpus_dir, config,
                                    encoder=_SerialEncoder(config) if dense else None)
    on_gpu = searcher.dense is not None and type(searcher.dense.index).__name__.startswith("Gpu")
    return searcher, on_gpu


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _exit_with_parent() -> None:
    """SIGTERM ourselves when the process that started us dies (even by SIGKILL), so a
    crashed flow leaves no server holding the port."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped; an expected error (no index, a taken port, a bad config) prints
    its message alone and exits with its code (`searchrl.exit_codes`)."""
    try:
        _serve(argv)
    except Exception as exc:
        return report_error(exc)
    return 0


def _serve(argv: list[str] | None) -> None:
    import uvicorn

    from searchrl.retrieval.service import check_port_free

    parser = argparse.ArgumentParser(description="Serve a built index over HTTP",
                                     epilog=exit_code_table(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index-dir", type=Path, required=True,
                        help="the build_index stage directory, or one corpus directory")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--corpus", default=MAIN_CORPUS)
    parser.add_argument("--host", default=None, help="default: index.service_host")
    parser.add_argument("--port", type=int, default=None, help="default: index.service_port")
    parser.add_argument("--allow-remote-without-token", action="store_true")
    parser.add_argument("--serialise", action="store_true",
                        help="one search at a time (the pre-concurrency behaviour)")
    parser.add_argument("--no-access-log", action="store_true",
                        help="no line per request (use /stats)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="stop when the starting process dies")
    parser.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides).index
    host = args.host or config.service_host
    port = args.port or config.service_port
    token = os.environ.get(config.service_token_env) or None
    if not _is_loopback(host) and token is None and not args.allow_remote_without_token:
        raise ConfigError(f"refusing to serve on {host} without a token: set "
                          f"${config.service_token_env} (or pass --allow-remote-without-token)")
    if args.exit_with_parent:
        _exit_with_parent()
    check_port_free(host, port)  # before the index loads, which can take minutes
    searcher, on_gpu = load_service_searcher(resolve_corpus(args.index_dir, args.corpus), config)
    app = create_app(searcher, config, token, serialise=args.serialise or on_gpu,
                     info={"passages": searcher.size, "retriever": searcher.retriever,
                           "corpus": args.corpus, "pid": os.getpid()})
    logging.basicConfig(level=logging.INFO)
    logger.info("serving %d passages on %s:%d (%s)", searcher.size, host, port,
                "serialised" if args.serialise or on_gpu
                else f"{config.service_workers} concurrent searches")
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=not args.no_access_log)


if __name__ == "__main__":
    raise SystemExit(main())
