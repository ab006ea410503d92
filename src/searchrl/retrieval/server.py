"""The retrieval HTTP service (FastAPI): Search-R1-compatible batch `/retrieve` + `/health`.

    POST /retrieve {"queries": [str], "topk": int = 3, "return_scores": bool = false}
      -> {"result": [[{"document": {"id", "title", "contents"}, "score": float}, ...], ...]}
         (with return_scores=false each hit is the bare document, as in Search-R1)
    GET  /health  -> {"status": "ok", "passages": int, "retriever": str}

Limits (from `IndexConfig`) answer with a clear 4xx: empty batch or bad top-k or an overlong
query 422, batch above `max_batch` 413, missing/wrong bearer token 401 (when a token is set).
Search failures answer 503 so clients retry. Bound to 127.0.0.1 unless told otherwise; a
non-loopback bind without a token is refused.

    python -m searchrl.retrieval.server --index-dir runs/tiny/build_index --config configs/tiny.yaml
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import logging
import os
import threading
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from searchrl.config import IndexConfig, load_config
from searchrl.retrieval.base import Searcher, SearchError
from searchrl.types import SearchHit

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 3  # Search-R1's retriever default


class RetrieveRequest(BaseModel):
    queries: list[str]
    topk: int = DEFAULT_TOP_K
    return_scores: bool = False


class RetrieveResponse(BaseModel):
    result: list[list[dict[str, Any]]] = Field(default_factory=list)


def _document(hit: SearchHit) -> dict[str, Any]:
    return {"id": hit.doc_id, "title": hit.title, "contents": hit.contents}


def create_app(searcher: Searcher, config: IndexConfig, token: str | None = None,
               info: dict[str, Any] | None = None) -> FastAPI:
    """An app serving `searcher`. `token`: required bearer token, None for none.
    `info` is merged into the /health answer."""
    app = FastAPI(title="searchrl retrieval", version="1")
    # bm25s, faiss and torch are not documented as safe under concurrent calls from FastAPI's
    # thread pool; callers get throughput by batching, not by concurrency.
    lock = threading.Lock()

    def check_token(authorization: Annotated[str | None, Header()] = None) -> None:
        if token is None:
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or invalid bearer token "
                                "(send 'Authorization: Bearer <token>')",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **(info or {})}

    @app.post("/retrieve", dependencies=[Depends(check_token)])
    def retrieve(request: RetrieveRequest) -> RetrieveResponse:
        n = len(request.queries)
        if n == 0:
            raise HTTPException(status_code=422, detail="queries must be a non-empty list")
        if n > config.max_batch:
            raise HTTPException(status_code=413, detail=f"batch of {n} queries exceeds "
                                f"max_batch={config.max_batch}; split it")
        if not 1 <= request.topk <= config.max_top_k:
            raise HTTPException(status_code=422, detail=f"topk={request.topk} must be between "
                                f"1 and max_top_k={config.max_top_k}")
        for i, query in enumerate(request.queries):
            if len(query) > config.max_query_chars:
                raise HTTPException(status_code=422, detail=f"queries[{i}] has {len(query)} "
                                    f"characters, above max_query_chars={config.max_query_chars}")
        try:
            with lock:
                hits = searcher.search_batch(request.queries, request.topk)
        except SearchError as exc:
            raise HTTPException(status_code=503, detail=f"search failed: {exc}") from exc
        if request.return_scores:
            return RetrieveResponse(result=[[{"document": _document(h), "score": h.score}
                                             for h in per_query] for per_query in hits])
        return RetrieveResponse(result=[[_document(h) for h in per_query] for per_query in hits])

    return app


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    import uvicorn

    from searchrl.retrieval.index_store import MAIN_CORPUS, load_corpus_searcher, resolve_corpus

    parser = argparse.ArgumentParser(description="Serve a built index over HTTP")
    parser.add_argument("--index-dir", type=Path, required=True,
                        help="the build_index stage directory, or one corpus directory")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--corpus", default=MAIN_CORPUS)
    parser.add_argument("--host", default=None, help="default: index.service_host")
    parser.add_argument("--port", type=int, default=None, help="default: index.service_port")
    parser.add_argument("--allow-remote-without-token", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key.sub=value config overrides")
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides).index
    host = args.host or config.service_host
    port = args.port or config.service_port
    token = os.environ.get(config.service_token_env) or None
    if not _is_loopback(host) and token is None and not args.allow_remote_without_token:
        raise SystemExit(f"refusing to serve on {host} without a token: set "
                         f"${config.service_token_env} (or pass --allow-remote-without-token)")
    searcher = load_corpus_searcher(resolve_corpus(args.index_dir, args.corpus), config)
    app = create_app(searcher, config, token, info={"passages": searcher.size,
                                                    "retriever": searcher.retriever,
                                                    "corpus": args.corpus})
    logger.info("serving %d passages on %s:%d", searcher.size, host, port)
    uvicorn.run(app, host=host, port=port, log_level="info")


if __name__ == "__main__":
    main()
