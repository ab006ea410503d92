"""Dense embedding through the engine (searchrl/ray_engine.py): local (one process) beside Ray with
1 and 2 workers on this machine, in interleaved rounds, printed side by side with ratios; and
Ray's fixed cost (start a private instance, start the workers, load the encoder).

    .venv/bin/python benchmarks/bench_ray_engine.py --passages 2000 --rounds 2

Real Wikipedia paragraphs (data/wiki2_corpus6k, copied as bench_embedding.py copies them), the
bundled MiniLM on CPU, batch 64, shards of 256; every run embeds from an empty cache. Local
uses all torch threads of the process; Ray's one worker gets `worker_cpus=2` (2 threads), two
workers 1 each, so every row uses the machine's 2 cores. Figures: docs/results/ray_scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = REPO.parent / "shared" / "data" / "wiki2_corpus6k" / "corpus.jsonl"
for _key, _value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                     "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_key, _value)


def texts(n: int) -> list[str]:
    rows = [json.loads(line)["contents"] for line in TEXT.read_text().splitlines() if line]
    return [rows[i % len(rows)] + (f" (copy {i // len(rows)})" if i >= len(rows) else "")
            for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shard-size", type=int, default=256)
    args = parser.parse_args()

    import numpy as np
    import ray

    from searchrl.config import EngineConfig, IndexConfig
    from searchrl.ray_engine import open_engine
    from searchrl.retrieval.embedding import EmbeddingCache, embed_corpus

    config = IndexConfig(retriever="dense", encoder_device="cpu", encoder_batch_size=64,
                         encoder_shard_size=args.shard_size, encoder_workers=1)
    corpus = texts(args.passages)

    def chunks() -> list[list[str]]:
        return [corpus]

    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    print(f"load average before: {os.getloadavg()}")
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - started
    engines = {"ray, 1 worker": EngineConfig(kind="ray", workers=1, worker_cpus=2),
               "ray, 2 workers": EngineConfig(kind="ray", workers=2, worker_cpus=1)}
    walls: dict[str, list[float]] = {"local": [], **{k: [] for k in engines}}
    workers_up: dict[str, list[float]] = {k: [] for k in engines}
    reference: bytes | None = None
    for round_ in range(args.rounds):
        for name in walls:
            out = work / f"{round_}-{name.replace(' ', '_').replace(',', '')}"
            out.mkdir()
            t0 = time.perf_counter()
            if name == "local":
                embed_corpus(chunks, EmbeddingCache(out / "cache", config), config,
                             out / "emb.npy", progress=False)
            else:
                with open_engine(engines[name]) as engine:
                    assert engine is not None
                    engine.workers()
                    workers_up[name].append(time.perf_counter() - t0)
                    embed_corpus(chunks, EmbeddingCache(out / "cache", config), config,
                                 out / "emb.npy", progress=False, engine=engine)
            walls[name].append(time.perf_counter() - t0)
            got = np.load(out / "emb.npy").tobytes()
            reference = reference or got
            assert got == reference, f"{name}: vectors differ from the first run's"
            shutil.rmtree(out)
    ray.shutdown()
    shutil.rmtree(work)
    local = statistics.median(walls["local"])
    print(f"load average after: {os.getloadavg()}")
    print(f"{args.passages} passages, shards of {args.shard_size}, {args.rounds} rounds "
          f"(median wall s); vectors identical in every run")
    print(f"ray.init of a private 2-CPU instance: {ray_start:.1f} s (once per process)")
    print("| engine | wall s | / local | workers started + ready s |")
    print("| --- | --- | --- | --- |")
    for name, values in walls.items():
        up = f"{statistics.median(workers_up[name]):.1f}" if name in workers_up else "-"
        print(f"| {name} | {statistics.median(values):.1f} | "
              f"{statistics.median(values) / local:.2f} | {up} |")


if __name__ == "__main__":
    main()
