"""What one malformed request costs the retrieval server: time, answer size, peak memory.

    .venv/bin/python benchmarks/bench_bad_body.py [--config configs/tiny.yaml] [--mb 3]
        [--shape ints|long|many]

Builds the server app with the config's `index` limits (a searcher that never gets called)
and posts one body of about `--mb` MB, as an attacker or a broken client would: `ints`, a
list of integers where strings belong (the review's case: 37.6 s, 2 GB and a 160 MB echo
before the fix); `long`, one query far above `max_query_chars`; `many`, short queries far
above `max_batch`. Prints the status, the answer's size, the seconds the request took and the
process's peak RSS (MB). Run it under `/usr/bin/time -v` (or any whole-process timer) to
compare against a plain import: the difference is what the request cost.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Sequence

from fastapi.testclient import TestClient

from searchrl.config import load_config
from searchrl.retrieval.server import create_app
from searchrl.types import SearchHit


class NeverSearched:
    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        raise AssertionError("a malformed request reached the searcher")


def bad_body(shape: str, megabytes: float) -> bytes:
    size = int(megabytes * 1_000_000)
    if shape == "ints":
        return json.dumps({"queries": [1] * (size // 3)}).encode()
    if shape == "long":
        return json.dumps({"queries": ["x" * size]}).encode()
    return json.dumps({"queries": ["q"] * (size // 5)}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--mb", type=float, default=3.0)
    parser.add_argument("--shape", choices=("ints", "long", "many"), default="ints")
    args = parser.parse_args()
    config = load_config(args.config, []).index
    api = TestClient(create_app(NeverSearched(), config))
    body = bad_body(args.shape, args.mb)
    start = time.perf_counter()
    resp = api.post("/retrieve", content=body, headers={"Content-Type": "application/json"})
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"shape": args.shape, "body_bytes": len(body), "status": resp.status_code,
                      "answer_bytes": len(resp.content), "seconds": round(seconds, 3),
                      "peak_rss_mb": round(peak_mb, 1),
                      "answer_head": resp.text[:160]}, indent=2))


if __name__ == "__main__":
    main()
