"""Training throughput and peak memory of the GRPO trainer on the embedded default.

    .venv/bin/python benchmarks/bench_train.py [--steps 3] [key.sub=value ...]

Builds the synthetic world and a BM25 searcher in process, runs (or reuses) the cold start,
then `--steps` GRPO steps, and prints rollout tokens/s (policy-sampled tokens per second of
generation), update tokens/s (tokens through forward+backward per second of update), the
time per phase and the peak resident memory (and peak GPU memory on CUDA). Wall times on a
shared CPU are pessimistic.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from searchrl.config import load_config
from searchrl.data.synthetic import generate_world
from searchrl.eval.metrics import paired_bootstrap_delta
from searchrl.generation.factory import make_generator
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.rollout import RolloutBatch, run_rollouts
from searchrl.train.grpo import cold_start, greedy_eval, train_grpo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="reuse a cold start here")
    parser.add_argument("--compare", action="store_true",
                        help="also greedy test EM by hop: SFT (agentic, no_search, "
                             "retrieve_once) vs the GRPO policy")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = [f"train.steps={args.steps}", "train.eval_every=0", "train.resume=false",
                 "train.checkpoint_every=0", *args.overrides]
    config = load_config(args.config, overrides)
    world = generate_world(config.data.synthetic)
    searcher = LocalSearcher(world.passages, config.index.model_copy(update={"retriever": "bm25"}),
                             bm25=BM25Index.build([p.contents for p in world.passages]))
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-train-"))
    t0 = time.perf_counter()
    sft = cold_start(config, world.splits["train"], world.passages, searcher, work / "sft")
    sft_s = time.perf_counter() - t0
    result = train_grpo(config, world.splits["train"], searcher, sft, work / "grpo",
                        progress=False)
    rows = [json.loads(x) for x in result.metrics_path.read_text().splitlines()]
    steps = [r for r in rows if "time_update_s" in r]
    gen_s = sum(r["time_generation_s"] for r in rows)
    upd_s = sum(r["time_update_s"] for r in steps)
    report = {
        "device": "cuda" if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()}",
        "steps": len(rows),
        "rollouts_per_step": config.train.questions_per_step * config.rollout.group_size,
        "rollout_tokens_per_s": sum(r["rollout_tokens"] for r in rows) / max(gen_s, 1e-9),
        "update_tokens_per_s": sum(r["update_tokens"] for r in steps) / max(upd_s, 1e-9),
        "seconds_per_step": sum(r["step_seconds"] for r in rows) / max(len(rows), 1),
        "time_generation_s": gen_s,
        "time_retrieval_s": sum(r["time_retrieval_s"] for r in rows),
        "time_logprobs_s": sum(r.get("time_logprobs_s", 0.0) for r in rows),
        "time_update_s": upd_s,
        "cold_start_s": sft_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if torch.cuda.is_available():
        report["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    json.dump({k: round(v, 2) if isinstance(v, float) else v for k, v in report.items()},
              sys.stdout, indent=2)
    print()
    if args.compare:
        test = world.splits["test"]
        systems = [("sft", sft, "agentic"), ("no_search", sft, "no_search"),
                   ("retrieve_once", sft, "retrieve_once"), ("grpo", result.policy_dir, "agentic")]
        correct: dict[str, list[float]] = {}
        for name, policy, mode in systems:
            batches: list[RolloutBatch] = []

            def capture(*a: Any, _out: list[RolloutBatch] = batches, **k: Any) -> RolloutBatch:
                _out.append(run_rollouts(*a, **k))
                return _out[-1]

            ev = greedy_eval(test, make_generator(config, policy_dir=policy), searcher, config,
                             mode=mode,
                             rollout_fn=capture)
            correct[name] = [float(r.correct) for r in batches[-1].records]
            print(name, json.dumps({k: round(v, 3) for k, v in sorted(ev.items())}))
        # Paired over the same questions (greedy, so one record per question, test order).
        for label, keep in (("all", [True] * len(test)),
                            *((f"hop{h}", [e.hops == h for e in test]) for h in (1, 2, 3))):
            pick = [i for i, k in enumerate(keep) if k]
            delta = paired_bootstrap_delta([correct["grpo"][i] for i in pick],
                                           [correct["sft"][i] for i in pick], samples=2000)
            print(f"grpo - sft EM {label}: {delta.mean * 100:+.1f} points, 95% CI "
                  f"[{delta.lo * 100:+.1f}, {delta.hi * 100:+.1f}] (n={delta.n})")
        print("curve:", result.curve_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
