"""Training with vs without the difficulty curriculum, at equal rollout budget.

A: curriculum filter (drop pass-rate 0/1 questions, easy -> hard) + dynamic zero-variance
   refill during training;
B: the unfiltered train split in its original order, no dynamic filtering.

A runs `train.steps` steps; its rollouts (refills included) are counted and B runs as many steps
as that budget buys it. Both start from the same SFT policy. Held-out EM (greedy, dev split,
every `train.eval_every` steps) and the zero-variance group fraction per step go to one MLflow
parent run with two child runs (compare them side by side in the MLflow UI), and to a PNG.

    .venv/bin/python benchmarks/bench_curriculum.py --out runs/bench_curriculum [overrides]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig, load_config
from searchrl.curriculum.run import run_curriculum
from searchrl.datasets.io import read_passages, read_qa
from searchrl.datasets.tuning import default_tuning_seed, require_tuning_world
from searchrl.retrieval.index_store import MAIN_CORPUS, build_indexes, load_searcher
from searchrl.sinks import NullSink
from searchrl.tracking import end_run, start_child_run, start_parent_run
from searchrl.train.cold_start.build import cold_start
from searchrl.train.grpo.trainer import train_grpo
from searchrl.validation.validate import validate_gold_labels


def _rollouts_per_step(history: list[dict[str, Any]], config: PipelineConfig) -> list[int]:
    group = config.rollout.group_size
    return [int(h.get("fill_groups_drawn", config.train.questions_per_step)) * group
            for h in history]


def _read_history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _plot(runs: dict[str, list[dict[str, Any]]], budgets: dict[str, list[int]],
          path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_em, ax_zv) = plt.subplots(1, 2, figsize=(11, 4))
    for name, history in runs.items():
        spent = [sum(budgets[name][: i + 1]) for i in range(len(history))]
        evals = [(spent[i], h["dev_em"]) for i, h in enumerate(history) if "dev_em" in h]
        if evals:
            ax_em.plot(*zip(*evals, strict=True), marker="o", label=name)
        ax_zv.plot(spent, [h["zero_variance_fraction"] for h in history], label=name)
    ax_em.set(xlabel="rollouts spent", ylabel="held-out EM (greedy, dev)",
              title="Held-out exact match")
    ax_zv.set(xlabel="rollouts spent", ylabel="zero-variance group fraction",
              title="Groups that teach nothing")
    for ax in (ax_em, ax_zv):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_curriculum"))
    parser.add_argument("--world-seed", type=int, default=None,
                        help="a tuning world (data.synthetic.tuning_seeds; default: the first)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    overrides = [*args.overrides, f"run.work_dir={out / 'work'}"]
    world_seed = (default_tuning_seed(load_config(args.config, overrides))
                  if args.world_seed is None else args.world_seed)
    base = load_config(args.config, [*overrides, f"data.synthetic.seed={world_seed}"])
    require_tuning_world(base)
    uri = f"sqlite:///{out / 'mlflow.db'}"

    # --- shared inputs: data, index, SFT start, difficulty
    validated = validate_gold_labels(base, out / "validate")
    build_indexes({MAIN_CORPUS: validated.corpus_path}, {}, out / "index", base.index,
                  NullSink())
    searcher = load_searcher(out / "index", base.index)
    train_all = read_qa(validated.split_paths["train"])
    dev = read_qa(validated.split_paths["dev"])[: base.train.eval_questions]
    sft_dir = cold_start(base, train_all, read_passages(validated.corpus_path), searcher,
                         out / "sft")
    curriculum = run_curriculum(base, validated.split_paths["train"], sft_dir, searcher,
                                out / "curriculum")
    filtered = read_qa(curriculum.train_path)

    parent = start_parent_run(uri, "searchrl-bench-curriculum", "curriculum_comparison",
                              base.to_dict())
    runs: dict[str, list[dict[str, Any]]] = {}
    budgets: dict[str, list[int]] = {}

    def train(name: str, config: PipelineConfig, examples: list[Any]) -> None:
        sink = start_child_run(uri, parent.run_id, name)
        sink.log_params({"questions": len(examples), "steps": config.train.steps,
                         "curriculum.enabled": config.curriculum.enabled,
                         "dynamic_filtering": config.curriculum.dynamic_filtering})
        result = train_grpo(config, examples, searcher, sft_dir, out / name, sink=sink,
                            eval_examples=dev)
        runs[name] = _read_history(result.metrics_path)
        budgets[name] = _rollouts_per_step(runs[name], config)
        sink.log_metrics({"rollouts_total": float(sum(budgets[name]))})
        sink.end()

    with_filter = base.model_copy(update={"curriculum": base.curriculum.model_copy(
        update={"enabled": True, "dynamic_filtering": True})})
    train("with_filter", with_filter, filtered)
    budget = sum(budgets["with_filter"])
    per_step = base.train.questions_per_step * base.rollout.group_size
    steps_b = max(1, math.ceil(budget / per_step))
    without = base.model_copy(update={
        "curriculum": base.curriculum.model_copy(update={"enabled": False,
                                                         "dynamic_filtering": False}),
        "train": base.train.model_copy(update={"steps": steps_b})})
    train("without_filter", without, train_all)
    end_run(uri, parent.run_id)

    plot = out / "curriculum_comparison.png"
    _plot(runs, budgets, plot)
    summary = {name: {"rollouts": sum(budgets[name]), "steps": len(h),
                      "final_dev_em": next((x["dev_em"] for x in reversed(h) if "dev_em" in x),
                                           None),
                      "mean_zero_variance_fraction": sum(x["zero_variance_fraction"] for x in h)
                      / len(h)}
               for name, h in runs.items()}
    summary["curriculum_counts"] = curriculum.counts
    print(json.dumps(summary, indent=2))
    print(f"plot: {plot}\nMLflow: mlflow ui --backend-store-uri {uri} "
          f"(parent run {parent.run_id})")


if __name__ == "__main__":
    main()
