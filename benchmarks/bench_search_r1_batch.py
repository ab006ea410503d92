"""One Search-R1-sized `/retrieve` request: latency of 400 / 1000 / 4096 queries in one POST.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_search_r1_batch.py [--sizes 400,1000,4096]
        [--repeats 5] [--search-batches 256,8192] [--out runs/bench]

Search-R1's trainer posts every active rollout's query in one request (its example sends
400; a training batch of 512 prompts x 5 rollouts sends 2560) with `topk` 3 and
`return_scores`. Over the demo's BM25 index (configs/tiny.yaml's world and index settings),
this starts the real server (`retrieval/service.serve_index`: subprocess, loopback, token)
once per `--search-batches` value (the queries it searches at a time; 256 is the default,
8192 one search call a request) and sends each size `--repeats` times, as Search-R1 does: one
POST with every query (httpx here, its `requests`). Reported per size: median and best
seconds a request, queries/s at the median, the answer's size. Client and server share this
machine's cores. Results also go to `<out>/bench_search_r1_batch.json`.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from searchrl.config import load_config
from searchrl.datasets.reading_world import generate_reading_world
from searchrl.datasets.world import write_world
from searchrl.retrieval.index_store import build_index
from searchrl.retrieval.service import serve_index
from searchrl.sinks import NullSink
from searchrl.train.distributed.deepspeed_setup import free_port

ROOT = Path(__file__).resolve().parents[1]
TOP_K = 3  # Search-R1's retriever.topk


def post_all(url: str, token: str, queries: list[str]) -> tuple[float, int]:
    """(seconds, answer bytes) of one POST carrying every query, Search-R1's way."""
    start = time.perf_counter()
    resp = httpx.post(f"{url}/retrieve", timeout=300.0,
                      headers={"Authorization": f"Bearer {token}"},
                      json={"queries": queries, "topk": TOP_K, "return_scores": True})
    resp.raise_for_status()
    result = resp.json()["result"]
    seconds = time.perf_counter() - start
    if len(result) != len(queries):
        raise RuntimeError(f"{len(result)} results for {len(queries)} queries")
    return seconds, len(resp.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="400,1000,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--search-batches", default="256,8192")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    config = load_config(ROOT / "configs" / "tiny.yaml", [])
    world = generate_reading_world(config.data.synthetic)
    questions = [ex.question for rows in world.splits.values() for ex in rows]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-search-r1-") as tmp:
        corpus = write_world(world, Path(tmp) / "world")["corpus"]
        build_index(corpus, Path(tmp) / "index", config.index, None, NullSink(), progress=False)
        print(f"demo BM25 index: {len(world.passages)} passages; {len(questions)} questions "
              f"cycled; top-k {TOP_K}, return_scores; median of {args.repeats} POSTs")
        for search_batch in (int(b) for b in args.search_batches.split(",")):
            port = free_port()
            served = config.index.model_copy(update={
                "mode": "service", "service_port": port,
                "service_url": f"http://127.0.0.1:{port}", "search_batch": search_batch,
                "max_batch": max(config.index.max_batch, *sizes),
                "service_search_timeout_s": 120.0})
            with serve_index(Path(tmp) / "index", served, log_dir=Path(tmp) / "log") as url:
                token = os.environ[served.service_token_env]
                post_all(url, token, questions[:64])  # warm-up
                for size in sizes:
                    queries = [questions[i % len(questions)] for i in range(size)]
                    runs = [post_all(url, token, queries) for _ in range(args.repeats)]
                    median = statistics.median(s for s, _ in runs)
                    row = {"search_batch": search_batch, "queries": size,
                           "median_s": median, "best_s": min(s for s, _ in runs),
                           "queries_per_s": size / median, "answer_mb": runs[0][1] / 2**20}
                    rows.append(row)
                    print(f"search_batch {search_batch:5d}  {size:5d} queries: "
                          f"median {median:6.3f} s  best {row['best_s']:6.3f} s  "
                          f"{row['queries_per_s']:7.0f} q/s  answer {row['answer_mb']:.2f} MB")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_search_r1_batch.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
