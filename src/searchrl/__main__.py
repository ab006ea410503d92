"""Command line: every stage runs without Prefect, reading and writing the same stage
directories under `run.work_dir` the flow uses (see searchrl/paths.py).

    python -m searchrl config --config configs/tiny.yaml [key.sub=value ...]
    python -m searchrl generate-world --config ... [--out DIR]
    python -m searchrl validate   --config ...     # stage 1
    python -m searchrl index      --config ...     # stage 2
    python -m searchrl curriculum --config ...     # stage 3 (cold start + difficulty filter)
    python -m searchrl train      --config ...     # stage 4 (in-process DeepSpeed on CPU)
    python -m searchrl evaluate   --config ...     # stage 5
    python -m searchrl gate       --config ...     # stage 6 (exit 0 on GO, 1 on NO-GO)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from searchrl.config import ConfigError, PipelineConfig, load_config
from searchrl.paths import StagePaths

STAGES = ["config", "generate-world", "validate", "index", "curriculum", "train", "evaluate",
          "gate"]


def _require(path: Path, stage: str) -> Path:
    if not path.exists():
        raise SystemExit(f"{path} not found: run `python -m searchrl {stage}` first")
    return path


def _run_stage(stage: str, config: PipelineConfig, out: Path | None) -> int:
    paths = StagePaths(config.run.work_dir)
    validated = paths.validate_dir
    if stage == "config":
        print(json.dumps(config.to_dict(), indent=2))
    elif stage == "generate-world":
        from searchrl.data.synthetic import generate_world, write_world

        written = write_world(generate_world(config.data.synthetic), out or paths.source_dir)
        print(json.dumps({k: str(v) for k, v in written.items()}, indent=2))
    elif stage == "validate":
        from searchrl.contracts.validate import validate_gold_labels

        print(json.dumps(validate_gold_labels(config, out or validated).counts, indent=2))
    elif stage == "index":
        from searchrl.retrieval.index_store import MAIN_CORPUS, build_indexes
        from searchrl.tracking import NullSink

        corpus = _require(validated / "source" / "corpus.jsonl", "validate")
        evals = {s: validated / f"{s}.jsonl" for s in ("dev", "test")
                 if (validated / f"{s}.jsonl").is_file()}
        fingerprint, _ = build_indexes({MAIN_CORPUS: corpus}, {MAIN_CORPUS: evals},
                                       out or paths.index_dir, config.index, NullSink())
        print(json.dumps({"index_dir": str(out or paths.index_dir), "fingerprint": fingerprint}))
    elif stage == "curriculum":
        from searchrl.curriculum.stage import run_curriculum
        from searchrl.data.io import read_passages, read_qa
        from searchrl.retrieval.index_store import load_searcher
        from searchrl.train.grpo import cold_start

        train = _require(validated / "train.jsonl", "validate")
        searcher = load_searcher(_require(paths.index_dir, "index"), config.index)
        sft_dir = cold_start(config, read_qa(train),
                             read_passages(validated / "source" / "corpus.jsonl"), searcher,
                             paths.train_dir / "sft")
        filtered = run_curriculum(config, train, sft_dir, searcher, out or paths.curriculum_dir)
        print(json.dumps(filtered.counts, indent=2))
    elif stage == "train":
        from searchrl.retrieval.index_store import load_searcher
        from searchrl.train.grpo import train_policy_run

        curriculum = paths.curriculum_dir / "train_curriculum.jsonl"
        train = curriculum if curriculum.is_file() else _require(validated / "train.jsonl",
                                                                 "validate")
        dev = validated / "dev.jsonl"
        trained = train_policy_run(
            config, train, validated / "source" / "corpus.jsonl",
            load_searcher(_require(paths.index_dir, "index"), config.index),
            out or paths.train_dir, sft_train_path=validated / "train.jsonl",
            dev_path=dev if dev.is_file() else None)
        from searchrl.data.io import atomic_write_text

        # The gate prices training from this measured wall time (the flow passes it in
        # CheckpointRef.training_seconds).
        atomic_write_text((out or paths.train_dir) / "training_seconds.json",
                          json.dumps({"seconds": trained.seconds + trained.sft_seconds}))
        print(json.dumps({"policy_dir": str(trained.policy_dir), "steps": trained.steps_done,
                          "seconds": round(trained.seconds, 1)}))
    elif stage == "evaluate":
        from searchrl.eval.run import evaluate_stage

        evaluated = evaluate_stage(
            config, eval_path=_require(validated / f"{config.eval.split}.jsonl", "validate"),
            index_dir=_require(paths.index_dir, "index"),
            policy_dir=str(_require(paths.train_dir / "policy", "train")),
            sft_dir=str(paths.train_dir / "sft"), out_dir=out or paths.eval_dir)
        print(json.dumps({name: s.summary.em.mean for name, s in evaluated.systems.items()}))
    elif stage == "gate":
        from searchrl.data.io import read_qa
        from searchrl.eval.run import RESULTS_FILE, load_eval_result
        from searchrl.gate.report import write_gate_report

        evaluation = load_eval_result(_require(paths.eval_dir / RESULTS_FILE, "evaluate"))
        metrics = paths.train_dir / "metrics.jsonl"
        seconds_file = paths.train_dir / "training_seconds.json"
        seconds = (json.loads(seconds_file.read_text())["seconds"]
                   if seconds_file.is_file() else None)
        outcome = write_gate_report(
            config, evaluation, out or paths.gate_dir,
            gold_pairs=len(read_qa(_require(validated / "train.jsonl", "validate"))),
            training_seconds=seconds, metrics_path=metrics if metrics.is_file() else None)
        print(outcome.md_path.read_text())
        return 0 if outcome.result.go else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="searchrl")
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", type=Path, default=None, help="override the stage directory")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides")
    args = parser.parse_intermixed_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return _run_stage(args.stage, config, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
