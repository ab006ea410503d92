"""Retrieval benchmark: every comparison measured side by side in one run, on one machine.

On a synthetic corpus, whose template words hit most posting lists; the figures on real text
(bm25s vs rank-bm25 by corpus size, the HNSW efSearch x M curve, embedding backends) are
benchmarks/bench_retrieval_real.py -> docs/results/retrieval_performance.md.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_retrieval.py [--passages 100000]
        [--dense-passages 10000] [--out runs/bench]

1. bm25s vs rank-bm25 queries/s, one thread, same 100,000-passage synthetic corpus, same
   tokenisation (bm25s' regex + English stopwords), query tokenisation included in both.
2. batched vs one-at-a-time queries (bm25s; and the MiniLM query encoder).
3. faiss HNSW / IVF / IVF-PQ vs Flat: queries/s and recall@10 against Flat's exact top 10,
   on MiniLM embeddings of the first `--dense-passages` passages (embedding all 100,000 on
   a shared 2-core CPU would take hours), then on `--faiss-vectors` (default 100,000)
   vectors: those real embeddings extended with interpolations of them.
4. retrieval service latency p50/p95 at batch 1 and 32 (uvicorn subprocess over the BM25
   index of the 100,000 passages, our client, loopback).
5. recall@5 of BM25, dense and hybrid on the bundled HotpotQA sample (100 questions, 994
   passages).

Threads are pinned to one (env set before numpy/torch import) so the ratios do not depend
on how busy the other cores are. Results are also written to `<out>/bench_retrieval.json`.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import faiss  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from searchrl.config import IndexConfig, SyntheticWorldConfig  # noqa: E402
from searchrl.datasets.io import write_jsonl  # noqa: E402
from searchrl.datasets.synthetic import generate_world  # noqa: E402
from searchrl.retrieval.bm25 import BM25Index  # noqa: E402
from searchrl.retrieval.client import RetrievalClient  # noqa: E402
from searchrl.retrieval.dense import Encoder, build_faiss, faiss_params  # noqa: E402
from searchrl.retrieval.index_store import build_index  # noqa: E402
from searchrl.sinks import NullSink  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOTPOT = ROOT / "data" / "hotpotqa_train100"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def line(label: str, value: str) -> None:
    print(f"  {label:<52} {value}", flush=True)


# --- corpus


def synthetic_corpus(n_passages: int, out: Path) -> tuple[Path, list[str], list[str]]:
    """(corpus path, passage texts, question texts): a synthetic world scaled to n passages."""
    # Passages per world = 2*people + cities + countries + 2*orgs (distractors double the
    # people and organisations); scale people/orgs so the world has at least n passages.
    people = n_passages * 9 // 20
    cfg = SyntheticWorldConfig(n_people=people, n_cities=max(40, n_passages // 50),
                               n_countries=max(12, n_passages // 500),
                               n_organisations=max(30, n_passages // 20),
                               n_train=2000, n_dev=0, n_test=0)
    world = generate_world(cfg)
    passages = world.passages[:n_passages]
    path = out / f"synthetic_{n_passages}.jsonl"
    if not path.exists():
        write_jsonl(path, passages)
    questions = [q.question for q in world.splits["train"]]
    return path, [p.contents for p in passages], questions


# --- 1 + 2: BM25


def bench_bm25(texts: list[str], queries: list[str], results: dict[str, Any]) -> None:
    import bm25s
    from rank_bm25 import BM25Okapi

    print(f"\n[1] BM25 libraries, one thread, {len(texts)} passages", flush=True)
    index, build_s = timed(lambda: BM25Index.build(texts, k1=1.5, b=0.75))
    line("bm25s index build", f"{build_s:.1f} s")
    tokens, tok_s = timed(lambda: bm25s.tokenize(texts, stopwords="en", return_ids=False,
                                                 show_progress=False))
    okapi, okapi_build_s = timed(lambda: BM25Okapi(tokens, k1=1.5, b=0.75))
    line("rank-bm25 index build (+ same tokenisation)", f"{okapi_build_s + tok_s:.1f} s")

    n_rank = min(100, len(queries))

    def rank_bm25_one(q: str) -> list[int]:
        qtok = bm25s.tokenize([q], stopwords="en", return_ids=False, show_progress=False)[0]
        scores = okapi.get_scores(qtok)
        top = np.argpartition(-scores, 10)[:10]
        return [int(i) for i in top[np.argsort(-scores[top])]]

    rank_top, rank_s = timed(lambda: [rank_bm25_one(q) for q in queries[:n_rank]])
    single, single_s = timed(lambda: [index.search([q], 10)[0] for q in queries[:n_rank]])
    rank_qps, single_qps = n_rank / rank_s, n_rank / single_s
    agree = np.mean([len({r for r, _ in s} & set(t)) / 10
                     for s, t in zip(single, rank_top, strict=True)])
    line(f"rank-bm25 one-at-a-time ({n_rank} queries)", f"{rank_qps:8.1f} q/s")
    line(f"bm25s     one-at-a-time ({n_rank} queries)", f"{single_qps:8.1f} q/s")
    line("bm25s / rank-bm25", f"{single_qps / rank_qps:8.1f} x")
    line("top-10 overlap bm25s vs rank-bm25 (idf variants)", f"{agree:.2f}")

    print("\n[2] batched vs one-at-a-time", flush=True)
    n = len(queries)
    _, loop_s = timed(lambda: [index.search([q], 10) for q in queries])
    _, batch_s = timed(lambda: index.search(queries, 10))
    line(f"bm25s one-at-a-time ({n} queries)", f"{n / loop_s:8.1f} q/s")
    line(f"bm25s one batch of {n}", f"{n / batch_s:8.1f} q/s")
    line("batched / one-at-a-time", f"{loop_s / batch_s:8.1f} x")
    results["bm25"] = {"passages": len(texts), "bm25s_build_s": build_s,
                       "rank_bm25_build_s": okapi_build_s + tok_s,
                       "rank_bm25_qps": rank_qps, "bm25s_qps": single_qps,
                       "bm25s_over_rank_bm25": single_qps / rank_qps, "top10_overlap": agree,
                       "bm25s_loop_qps": n / loop_s, "bm25s_batch_qps": n / batch_s}


# --- 3: faiss types


def bench_faiss(texts: list[str], queries: list[str], n_vectors: int, out: Path,
                results: dict[str, Any]) -> None:
    print(f"\n[3] faiss index types on {len(texts)} MiniLM passage embeddings", flush=True)
    encoder = Encoder(IndexConfig(encoder_batch_size=128, encoder_device="cpu"))
    cached = out / f"minilm_{len(texts)}.npy"
    if cached.exists():  # a rerun skips the slow part; the rate is from the first run
        emb, emb_s = np.load(cached), float("nan")
    else:
        emb, emb_s = timed(lambda: encoder.encode_passages(texts, progress=False))
        np.save(cached, emb)
    line("embedding passages", f"{len(texts) / emb_s:8.1f} passages/s")
    qn = queries[:256]
    _, qloop_s = timed(lambda: [encoder.encode_queries([q]) for q in qn])
    qemb, qbatch_s = timed(lambda: encoder.encode_queries(queries))
    line(f"query encoding one-at-a-time ({len(qn)})", f"{len(qn) / qloop_s:8.1f} q/s")
    line(f"query encoding batched ({len(queries)})", f"{len(queries) / qbatch_s:8.1f} q/s")
    line("batched / one-at-a-time", f"{(len(queries) / qbatch_s) / (len(qn) / qloop_s):8.1f} x")
    faiss.omp_set_num_threads(1)
    rows = compare_faiss_types(emb, qemb)
    line("HNSW / Flat queries/s", f"{rows['HNSW']['qps'] / rows['Flat']['qps']:8.1f} x")
    big: dict[str, dict[str, float]] = {}
    if n_vectors > len(emb):
        # Embedding n_vectors passages is out of reach on this CPU; extend the real embeddings
        # with normalised interpolations of random pairs of them (+ noise) so the index sizes
        # that matter for HNSW vs Flat are measured on vectors near the real distribution.
        rng = np.random.default_rng(0)
        n_new = n_vectors - len(emb)
        a, b = rng.integers(0, len(emb), n_new), rng.integers(0, len(emb), n_new)
        w = rng.uniform(0.2, 0.8, (n_new, 1)).astype(np.float32)
        extra = w * emb[a] + (1 - w) * emb[b]
        extra += rng.normal(0, 0.02, extra.shape).astype(np.float32)
        extra /= np.linalg.norm(extra, axis=1, keepdims=True)
        big_emb = np.ascontiguousarray(np.concatenate([emb, extra]), dtype=np.float32)
        print(f"  -- {n_vectors} vectors ({len(emb)} real + {n_new} interpolated)", flush=True)
        big = compare_faiss_types(big_emb, qemb)
        line("HNSW / Flat queries/s", f"{big['HNSW']['qps'] / big['Flat']['qps']:8.1f} x")
    results["faiss"] = {"passages": len(texts), "embed_passages_per_s": len(texts) / emb_s,
                        "query_encode_loop_qps": len(qn) / qloop_s,
                        "query_encode_batch_qps": len(queries) / qbatch_s, "types": rows,
                        "vectors_extended": n_vectors, "types_extended": big}


def compare_faiss_types(emb: np.ndarray, qemb: np.ndarray) -> dict[str, dict[str, float]]:
    """Queries/s (one thread) and recall@10 against Flat's exact top 10, per index type."""
    rows: dict[str, dict[str, float]] = {}
    exact: np.ndarray | None = None
    for kind in ("Flat", "HNSW", "IVF", "IVF-PQ"):
        config = IndexConfig(faiss_index=kind, ivf_nlist=256, ivf_nprobe=16, pq_m=48)
        index, build_s = timed(lambda c=config: build_faiss(
            emb, faiss_params(c, emb.shape[0], emb.shape[1])))
        if kind == "HNSW":
            index.hnsw.efSearch = config.hnsw_ef_search
        if hasattr(index, "nprobe"):
            index.nprobe = config.ivf_nprobe
        (_, found), search_s = timed(lambda ix=index: ix.search(qemb, 10))
        if exact is None:
            exact = found
        recall = float(np.mean([len(set(f) & set(e)) / 10
                                for f, e in zip(found, exact, strict=True)]))
        rows[kind] = {"build_s": build_s, "qps": len(qemb) / search_s, "recall10_vs_flat": recall}
        line(f"{kind:<7} build {build_s:6.2f} s", f"{len(qemb) / search_s:9.0f} q/s   "
             f"recall@10 vs Flat {recall:.3f}")
    return rows


# --- 4: service latency


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_service(corpus: Path, out: Path, queries: list[str], results: dict[str, Any]) -> None:
    print("\n[4] retrieval service latency (BM25, uvicorn subprocess, loopback)", flush=True)
    config = IndexConfig(retriever="bm25", eval_all_retrievers=False)
    built, build_s = timed(lambda: build_index(corpus, out / "service_index", config, None,
                                               NullSink(), progress=False))
    line("build_index (bm25, incl. scan)", f"{build_s:.1f} s, {built.index_bytes / 1e6:.1f} MB")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "searchrl.retrieval.server", "--index-dir",
                             str(out / "service_index"), "--config",
                             str(ROOT / "configs" / "tiny.yaml"), "--port", str(port),
                             "index.retriever=bm25"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = RetrievalClient(f"http://127.0.0.1:{port}", timeout_s=30, retries=0)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                client.health()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("retrieval server did not start") from None
                time.sleep(0.5)
        rows: dict[str, dict[str, float]] = {}
        for batch, n_req in ((1, 200), (32, 40)):
            client.search_batch(queries[:batch], 3)  # warm-up
            lat = []
            for i in range(n_req):
                qs = [queries[(i * batch + j) % len(queries)] for j in range(batch)]
                _, s = timed(lambda qs=qs: client.search_batch(qs, 3))
                lat.append(s * 1000)
            p50 = statistics.median(lat)
            p95 = float(np.percentile(lat, 95))
            rows[f"batch_{batch}"] = {"p50_ms": p50, "p95_ms": p95,
                                      "queries_per_s": batch * n_req / (sum(lat) / 1000)}
            line(f"batch {batch:>2}: p50 / p95 per request", f"{p50:7.1f} / {p95:7.1f} ms   "
                 f"{rows[f'batch_{batch}']['queries_per_s']:7.0f} q/s")
        results["service"] = rows
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=20)


# --- 5: HotpotQA recall


def bench_hotpot(out: Path, results: dict[str, Any]) -> None:
    print("\n[5] recall@k on the bundled HotpotQA sample (MiniLM, Flat, RRF k=60)", flush=True)
    config = IndexConfig(retriever="hybrid")
    result, build_s = timed(lambda: build_index(
        HOTPOT / "corpus.jsonl", out / "hotpotqa_index", config,
        {"hotpotqa": HOTPOT / "questions.jsonl"}, NullSink(), name="hotpotqa", progress=False))
    recall = result.recall["hotpotqa"]
    reused = ",".join(k for k, v in result.components.items() if v) or "none"
    line(f"build (reused components: {reused})", f"{build_s:.1f} s")
    for retriever, by_k in recall.items():
        line(f"{retriever:<7} recall@1/3/5/10",
             " / ".join(f"{by_k[k]:.3f}" for k in sorted(by_k)))
    results["hotpotqa"] = recall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--dense-passages", type=int, default=10_000)
    parser.add_argument("--faiss-vectors", type=int, default=None,
                        help="index size for the second HNSW/IVF/Flat comparison "
                             "(default: --passages)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench")
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["bm25", "faiss", "service", "hotpot"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"threads": 1, "cpus": os.cpu_count()}
    (corpus, texts, queries), gen_s = timed(lambda: synthetic_corpus(args.passages, args.out))
    print(f"synthetic corpus: {len(texts)} passages, {len(queries)} questions "
          f"({gen_s:.1f} s)", flush=True)
    if "bm25" not in args.skip:
        bench_bm25(texts, queries, results)
    if "faiss" not in args.skip:
        bench_faiss(texts[:args.dense_passages], queries, args.faiss_vectors or args.passages,
                    args.out, results)
    if "service" not in args.skip:
        bench_service(corpus, args.out, queries, results)
    if "hotpot" not in args.skip:
        bench_hotpot(args.out, results)
    path = args.out / "bench_retrieval.json"
    previous = json.loads(path.read_text()) if path.exists() and args.skip else {}
    path.write_text(json.dumps(previous | results, indent=2, default=float))
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
