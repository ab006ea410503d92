"""Retrieval service under training-time load: concurrent searches vs the old single lock.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_service.py [--seconds 60]
        [--clients 8] [--batch 32] [--retrievers bm25,hybrid] [--out runs/bench]

Over the bundled real text (data/hotpotqa_train100: 994 passages, 100 questions) it builds
the project's index (BM25, and MiniLM + faiss Flat for dense / hybrid), then for each
retriever starts the real server (`retrieval/service.serve_index`: subprocess, loopback,
token) twice, concurrent (the default) and `--serialise` (one lock around every search, as
before), and drives it with `--clients` threads, each its own `RetrievalClient` (own
X-Client-Id, retries as in training), sending batches of `--batch` questions for `--seconds`.

Reported per run: failed requests (after the client's retries; must be 0), p50/p95 request
latency, requests/s and queries/s, the server's 429/503 counts from /stats, and its RSS at
start (after a warm-up), peak and end. Client and server share this machine's cores, so the
absolute figures are a floor; the concurrent/serialised ratio is the point. Results also go
to `<out>/bench_service.json`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from searchrl.config import IndexConfig
from searchrl.datasets.io import read_qa
from searchrl.retrieval.base import SearchError
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.index_store import build_index
from searchrl.retrieval.service import serve_index
from searchrl.sinks import NullSink

ROOT = Path(__file__).resolve().parents[1]
HOTPOT = ROOT / "data" / "hotpotqa_train100"
TOP_K = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RssSampler:
    """The server's RSS every 0.25 s: first sample, peak, last."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.proc.memory_info().rss)
            except psutil.Error:
                return
            self._stop.wait(0.25)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def mb(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"start_mb": self.samples[0] / 2**20, "peak_mb": max(self.samples) / 2**20,
                "end_mb": self.samples[-1] / 2**20}


def drive(config: IndexConfig, questions: list[str], clients: int, batch: int,
          seconds: float) -> dict[str, Any]:
    """`clients` threads sending `batch`-question requests for `seconds`."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    failures = [0] * clients
    errors: list[str] = []
    stop_at = time.perf_counter() + seconds

    def client_loop(i: int) -> None:
        client = RetrievalClient(config.service_url,
                                 token=os.environ.get(config.service_token_env),
                                 timeout_s=config.client_timeout_s,
                                 retries=config.client_retries,
                                 backoff_s=config.client_backoff_s, client_id=f"bench{i}")
        n = 0
        try:
            while time.perf_counter() < stop_at:
                start = (i * 7919 + n * batch) % len(questions)
                qs = [questions[(start + j) % len(questions)] for j in range(batch)]
                t0 = time.perf_counter()
                try:
                    hits = client.search_batch(qs, TOP_K)
                    if len(hits) != batch:
                        raise SearchError(f"{len(hits)} results for {batch} queries")
                except SearchError as exc:
                    failures[i] += 1
                    errors.append(str(exc)[:200])
                    continue
                finally:
                    n += 1
                latencies[i].append(time.perf_counter() - t0)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat_ms = np.array([x for per in latencies for x in per]) * 1000
    ok = len(lat_ms)
    return {"requests": ok + sum(failures), "failed": sum(failures), "errors": errors[:5],
            "wall_s": wall, "requests_per_s": ok / wall, "queries_per_s": ok * batch / wall,
            "p50_ms": float(np.percentile(lat_ms, 50)) if ok else float("nan"),
            "p95_ms": float(np.percentile(lat_ms, 95)) if ok else float("nan")}


def run_one(index_dir: Path, config: IndexConfig, questions: list[str], args: argparse.Namespace,
            serialise: bool, log_dir: Path) -> dict[str, Any]:
    with serve_index(index_dir, config, log_dir=log_dir,
                     server_args=["--serialise"] if serialise else []) as url:
        probe = RetrievalClient(url, token=os.environ.get(config.service_token_env))
        pid = int(probe.health()["pid"])
        probe.search_batch(questions[:args.batch], TOP_K)  # warm-up (lazy imports, caches)
        probe.close()
        with RssSampler(pid) as rss:
            row = drive(config, questions, args.clients, args.batch, args.seconds)
    stats = json.loads((log_dir / "stats.json").read_text())["totals"]
    row |= rss.mb() | {"rate_limited": stats["rate_limited"], "busy": stats["busy"],
                       "server_failed": stats["failed"]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per run (default 60)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=IndexConfig().service_workers,
                        help="index.service_workers: searches at once (concurrent runs)")
    parser.add_argument("--retrievers", default="bm25,hybrid",
                        help="comma-separated: bm25, dense, hybrid")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench")
    args = parser.parse_args()
    retrievers = [r.strip() for r in args.retrievers.split(",") if r.strip()]
    questions = [ex.question for ex in read_qa(HOTPOT / "questions.jsonl")]
    args.out.mkdir(parents=True, exist_ok=True)
    index_dir = args.out / "bench_service_index"
    dense = any(r != "bm25" for r in retrievers)
    t0 = time.perf_counter()
    build_index(HOTPOT / "corpus.jsonl", index_dir,
                IndexConfig(retriever="hybrid" if dense else "bm25", eval_all_retrievers=dense),
                None, NullSink(), progress=False)
    print(f"index over {HOTPOT / 'corpus.jsonl'}: {time.perf_counter() - t0:.1f} s "
          f"({'bm25 + MiniLM/faiss Flat' if dense else 'bm25'})", flush=True)
    print(f"{args.clients} clients x batch {args.batch}, top-{TOP_K}, {args.seconds:.0f} s per "
          f"run, {args.workers} server workers, {os.cpu_count()} CPUs shared by clients and "
          "server\n", flush=True)
    header = (f"{'retriever':<8} {'mode':<11} {'fail':>4} {'req/s':>7} {'q/s':>8} "
              f"{'p50 ms':>8} {'p95 ms':>8} {'429':>4} {'503':>4}  RSS start/peak/end MB")
    print(header)
    results: dict[str, Any] = {"clients": args.clients, "batch": args.batch,
                               "workers": args.workers,
                               "seconds": args.seconds, "cpus": os.cpu_count(), "runs": {}}
    for retriever in retrievers:
        config = IndexConfig.model_validate({
            "retriever": retriever, "eval_all_retrievers": dense, "mode": "service",
            "service_port": free_port(), "service_token_env": "SEARCHRL_BENCH_TOKEN",
            "service_workers": args.workers})
        for serialise in (False, True):
            mode = "serialised" if serialise else "concurrent"
            row = run_one(index_dir, config, questions, args, serialise,
                          args.out / f"bench_service_{retriever}_{mode}")
            results["runs"][f"{retriever}/{mode}"] = row
            print(f"{retriever:<8} {mode:<11} {row['failed']:>4} {row['requests_per_s']:>7.1f} "
                  f"{row['queries_per_s']:>8.0f} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
                  f"{row['rate_limited']:>4} {row['busy']:>4}  {row.get('start_mb', 0):.0f} / "
                  f"{row.get('peak_mb', 0):.0f} / {row.get('end_mb', 0):.0f}", flush=True)
        gain = (results["runs"][f"{retriever}/concurrent"]["requests_per_s"]
                / results["runs"][f"{retriever}/serialised"]["requests_per_s"])
        results[f"{retriever}_concurrency_gain"] = gain
        print(f"{retriever:<8} concurrent / serialised requests/s: {gain:.2f}x", flush=True)
    failed = sum(r["failed"] for r in results["runs"].values())
    (args.out / "bench_service.json").write_text(json.dumps(results, indent=2))
    print(f"\nfailed requests in all runs: {failed}; results in {args.out / 'bench_service.json'}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
