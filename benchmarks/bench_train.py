"""Where a GRPO step's time goes, and the trainer's throughput and peak memory.

    .venv/bin/python benchmarks/bench_train.py [--steps 40] [--work DIR] [--compare]
                                              [--compare-only]
                                              [key.sub=value ...]

Runs the demo's training stage in process on the embedded default (configs/tiny.yaml unless
`--config`): the synthetic world, a BM25 searcher, the cold start (reused from `--work` when
it holds one with the same key), then `--steps` GRPO steps with the config's dev evaluation
(every `train.eval_every` steps, `train.eval_questions` dev questions) and best-checkpoint
keeping, logging to an MLflow run in a SQLite store as the pipeline does (`--no-mlflow`:
to no sink; the logging's cost is part of "step other"). Prints the time per phase over all
steps, as seconds, share of the training wall time and seconds per step:

    generation      policy decoding in the rollouts        (rollout stats)
    retrieval       search calls in the rollouts           (rollout stats)
    rollout other   prompts, parsing, inserting, rewards
    old log-probs   no-grad passes of the sampling policy  (only mini-batches after the first)
    reference       no-grad passes of the reference policy (KL)
    forward         policy forward + loss, with gradient
    backward        engine.backward
    optimizer       engine.step
    re-estimate     curriculum re-estimates (curriculum.reestimate_every)
    dev eval        greedy dev evaluation (train.eval_every)
    keep best       saving a new best policy
    step other      the rest of each step (advantages, logging, metrics.jsonl)
    outside steps   setup, checkpoints, final save and curve

then rollout tokens/s (policy-sampled tokens per second of generation), update tokens/s
(tokens through forward+backward per second of update) and peak resident memory. `--compare`
also prints greedy test EM by hop: SFT (agentic, no_search, retrieve_once) vs the GRPO policy,
and the cold start's pass@8 and pass@1 on the train questions the curriculum estimated, read
from a pipeline run's curriculum stage (`--curriculum DIR`: its `difficulty.parquet`, the 8
sampled rollouts per question the stage drew; default: a filter_curriculum dir in `--work` or
beside it, as in a pipeline run's work dir; the line says whether it estimated this very cold
start; this benchmark runs no curriculum stage itself). Wall times on a shared CPU are
pessimistic; the shares are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from searchrl.config import load_config
from searchrl.curriculum.run import cold_start_pass_at_k
from searchrl.datasets.io import fingerprint
from searchrl.datasets.synthetic import generate_world
from searchrl.datasets.tuning import default_tuning_seed, require_tuning_world
from searchrl.eval.metrics import paired_bootstrap_delta
from searchrl.generation.factory import make_generator
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.rollout import RolloutBatch, run_rollouts
from searchrl.sinks import MetricsSink
from searchrl.tracking import start_parent_run
from searchrl.train.cold_start.build import cold_start
from searchrl.train.grpo.trainer import greedy_eval, train_grpo

# (label, metrics key); "rollout other", "step other" and "outside steps" are derived.
PHASES = [("generation", "time_generation_s"), ("retrieval", "time_retrieval_s"),
          ("rollout other", None), ("old log-probs", "time_old_logprobs_s"),
          ("reference", "time_ref_logprobs_s"), ("forward", "time_forward_s"),
          ("backward", "time_backward_s"), ("optimizer", "time_optimizer_s"),
          ("re-estimate", "time_reestimate_s"), ("dev eval", "time_eval_s"),
          ("keep best", "time_keep_best_s"), ("step other", None), ("outside steps", None)]


def phase_seconds(rows: list[dict[str, Any]], train_seconds: float) -> dict[str, float]:
    """Seconds per phase summed over the steps in `rows` (metrics.jsonl lines)."""
    out = {label: sum(r.get(key, 0.0) for r in rows) for label, key in PHASES if key}
    out["rollout other"] = (sum(r["time_rollout_s"] for r in rows)
                            - out["generation"] - out["retrieval"])
    steps = sum(r["step_seconds"] for r in rows)
    out["step other"] = steps - sum(out.values())
    out["outside steps"] = train_seconds - steps
    return {label: out[label] for label, _ in PHASES}


def print_phases(phases: dict[str, float], n_steps: int) -> None:
    total = sum(phases.values())
    print(f"{'phase':<15}{'seconds':>9}{'share':>8}{'s/step':>9}")
    for label, seconds in sorted(phases.items(), key=lambda kv: -kv[1]):
        print(f"{label:<15}{seconds:>9.1f}{seconds / total:>8.1%}{seconds / n_steps:>9.3f}")
    print(f"{'total':<15}{total:>9.1f}{1:>8.0%}{total / n_steps:>9.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", type=Path, default=None, help="reuse a cold start here")
    parser.add_argument("--compare", action="store_true",
                        help="also greedy test EM by hop: SFT (agentic, no_search, "
                             "retrieve_once) vs the GRPO policy")
    parser.add_argument("--compare-only", action="store_true",
                        help="no training: compare --work's cold start with its GRPO policy")
    parser.add_argument("--curriculum", type=Path, default=None,
                        help="a pipeline run's filter_curriculum dir: the cold start's pass@k "
                             "with the comparison (default: one in --work or beside it)")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--no-mlflow", action="store_true", help="log to no sink")
    parser.add_argument("--world-seed", type=int, default=None,
                        help="a tuning world (data.synthetic.tuning_seeds; default: the first)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    overrides = [f"train.steps={args.steps}", "train.resume=false", *args.overrides]
    world_seed = (default_tuning_seed(load_config(args.config, overrides))
                  if args.world_seed is None else args.world_seed)
    config = load_config(args.config, [*overrides, f"data.synthetic.seed={world_seed}"])
    require_tuning_world(config)
    world = generate_world(config.data.synthetic)
    searcher = LocalSearcher(world.passages, config.index.model_copy(update={"retriever": "bm25"}),
                             bm25=BM25Index.build([p.contents for p in world.passages]))
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-train-"))
    # A pipeline run's work dir holds filter_curriculum beside train_policy (its sft).
    curriculum = args.curriculum or next(
        (d for d in (work / "filter_curriculum", work.parent / "filter_curriculum")
         if (d / "difficulty.parquet").is_file()), work / "filter_curriculum")
    if args.compare_only:
        best = work / "grpo" / "best_policy"
        compare(config, world, searcher, work / "sft",
                best if best.is_dir() else work / "grpo" / "policy", curriculum)
        return 0
    t0 = time.perf_counter()
    sft = cold_start(config, world.splits["train"], world.passages, searcher, work / "sft")
    sft_s = time.perf_counter() - t0
    dev = world.splits["dev"][:config.train.eval_questions]
    sink: MetricsSink | None = None
    if not args.no_mlflow:
        uri = f"sqlite:///{work / 'mlflow.db'}"
        sink = start_parent_run(uri, "bench-train", "bench", {})
    result = train_grpo(config, world.splits["train"], searcher, sft, work / "grpo",
                        eval_examples=dev, progress=False, sink=sink)
    rows = [json.loads(x) for x in result.metrics_path.read_text().splitlines()]
    phases = phase_seconds(rows, result.seconds)
    update_s = phases["forward"] + phases["backward"] + phases["optimizer"]
    report = {
        "device": "cuda" if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()}",
        "steps": len(rows),
        "rollouts_per_step": config.train.questions_per_step * config.rollout.group_size,
        "train_seconds": result.seconds,
        "seconds_per_step": sum(r["step_seconds"] for r in rows) / max(len(rows), 1),
        "rollout_tokens_per_s": sum(r["rollout_tokens"] for r in rows)
        / max(phases["generation"], 1e-9),
        "update_tokens_per_s": sum(r.get("update_tokens", 0.0) for r in rows)
        / max(update_s, 1e-9),
        "cold_start_s": sft_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "phases_s": phases,
    }
    if torch.cuda.is_available():
        report["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(f"\n== {len(rows)} GRPO steps ({args.config}), {report['device']}, "
          f"{report['rollouts_per_step']} rollouts/step, cold start {sft_s:.0f} s")
    print_phases(phases, len(rows))
    print(f"rollout {report['rollout_tokens_per_s']:.0f} tok/s, update "
          f"{report['update_tokens_per_s']:.0f} tok/s, {report['seconds_per_step']:.2f} s/step, "
          f"peak RSS {report['peak_rss_mib']:.0f} MiB")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    if args.compare:
        compare(config, world, searcher, sft, result.best_policy_dir or result.policy_dir,
                curriculum)
        print("curve:", result.curve_path)
    return 0


def print_cold_start_pass(curriculum_dir: Path, sft: Path) -> None:
    rates = cold_start_pass_at_k(curriculum_dir)
    if rates is None:
        print(f"cold start pass@8: no curriculum estimate in {curriculum_dir} (pass "
              "--curriculum RUN_WORK_DIR/filter_curriculum)")
        return
    same = rates["policy_fingerprints"] == [fingerprint(sft)] if sft.is_dir() else False
    ks = "/".join(str(k) for k in rates["k"])
    print(f"cold start (curriculum estimate, {rates['questions']} train questions x {ks} "
          f"samples): pass@{ks} {rates['pass_at_k']:.3f}, pass@1 {rates['pass_at_1']:.3f} "
          f"({'this' if same else 'NOT this'} cold start: {curriculum_dir})")


def compare(config: Any, world: Any, searcher: Any, sft: Path, policy: Path,
            curriculum: Path | None = None) -> None:
    if curriculum is not None:
        print_cold_start_pass(curriculum, sft)
    test = world.splits["test"]
    systems = [("sft", sft, "agentic"), ("no_search", sft, "no_search"),
               ("retrieve_once", sft, "retrieve_once"), ("grpo", policy, "agentic")]
    correct: dict[str, list[float]] = {}
    for name, policy_dir, mode in systems:
        batches: list[RolloutBatch] = []

        def capture(*a: Any, _out: list[RolloutBatch] = batches, **k: Any) -> RolloutBatch:
            _out.append(run_rollouts(*a, **k))
            return _out[-1]

        ev = greedy_eval(test, make_generator(config, policy_dir=policy_dir), searcher, config,
                         mode=mode, rollout_fn=capture)
        correct[name] = [float(r.correct) for r in batches[-1].records]
        print(name, json.dumps({k: round(v, 3) for k, v in sorted(ev.items())}))
    # Paired over the same questions (greedy, so one record per question, test order), by
    # hop count and by the world's named slices (unseen_phrasing, answer_novel, ...).
    named = sorted({s for e in test for s in e.slices})
    for label, keep in (("all", [True] * len(test)),
                        *((f"hop{h}", [e.hops == h for e in test]) for h in (1, 2, 3)),
                        *((name, [name in e.slices for e in test]) for name in named)):
        pick = [i for i, k in enumerate(keep) if k]
        delta = paired_bootstrap_delta([correct["grpo"][i] for i in pick],
                                       [correct["sft"][i] for i in pick], samples=2000)
        em = {k: sum(correct[k][i] for i in pick) / max(len(pick), 1) for k in correct}
        print(f"{label}: EM sft {em['sft']:.3f} retrieve_once {em['retrieve_once']:.3f} grpo "
              f"{em['grpo']:.3f}; grpo - sft EM {delta.mean * 100:+.1f} points, 95% CI "
              f"[{delta.lo * 100:+.1f}, {delta.hi * 100:+.1f}] (n={delta.n})")


if __name__ == "__main__":
    raise SystemExit(main())
