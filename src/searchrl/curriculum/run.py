"""Stage 3 library entry: estimate each training question's difficulty with the current policy,
drop the zero-variance ends, order the rest, and write the artifacts.

Artifacts (all under `out_dir`, manifests last so nothing partial looks complete):
`train_curriculum.jsonl` (kept questions in training order), `difficulty.parquet` (one row per
question with the policy and data fingerprints it came from), `dropped.jsonl` (each dropped
question with its reason), `difficulty_hist.png`. The estimate's rollouts are returned too:
the stage keeps their correct ones for rejection sampling (`train/rejection_sampling.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from tqdm import tqdm

from searchrl.config import PipelineConfig
from searchrl.curriculum.difficulty import (
    FilterResult,
    QuestionDifficulty,
    estimate_difficulty,
    filter_by_difficulty,
)
from searchrl.datasets.io import atomic_write_text, fingerprint, read_qa, write_jsonl
from searchrl.generation.base import Generator
from searchrl.generation.factory import make_generator
from searchrl.plots import save_figure
from searchrl.retrieval.base import Searcher
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import run_rollouts
from searchrl.types import QAExample


@dataclass
class CurriculumResult:
    train_path: Path
    difficulty_path: Path
    dropped_path: Path
    histogram_path: Path
    counts: dict[str, int]
    mean_pass_rate: float
    # The estimate's rollouts (its samples of the policy), for reuse beyond the estimate.
    records: list[RolloutRecord] = field(default_factory=list)


def rollout_pass_rates(examples: Sequence[QAExample], generator: Generator,
                       searcher: Searcher, config: PipelineConfig, samples_per_question: int,
                       chunk: int = 16) -> list[RolloutRecord]:
    """`samples_per_question` sampled rollouts per question, in chunks with a progress bar."""
    records: list[RolloutRecord] = []
    for start in tqdm(range(0, len(examples), chunk), desc="curriculum rollouts", unit="chunk"):
        batch = run_rollouts(examples[start:start + chunk], generator, searcher,
                             config.rollout, config.reward, group_size=samples_per_question,
                             seed=config.run.seed + start)
        records.extend(batch.records)
    return records


def _plot_histogram(difficulties: Sequence[QuestionDifficulty], path: Path) -> None:
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    by_hops: dict[int, list[float]] = {}
    for d in difficulties:
        by_hops.setdefault(d.hops or 0, []).append(d.pass_rate)
    ax.hist([by_hops[h] for h in sorted(by_hops)], bins=10, range=(0, 1), stacked=True,
            label=[f"{h} hops" for h in sorted(by_hops)])
    ax.set_xlabel("pass rate of the starting policy (binary EM over G rollouts)")
    ax.set_ylabel("questions")
    ax.set_title("Training-question difficulty")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def write_artifacts(examples: Sequence[QAExample], result: FilterResult,
                    difficulties: Sequence[QuestionDifficulty], out_dir: Path,
                    policy_fingerprint: str, data_fingerprint: str,
                    unestimated: Sequence[QAExample] = ()) -> CurriculumResult:
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    by_id = {ex.id: ex for ex in examples}
    kept_ids = {d.example_id for d in result.kept}
    reasons = {d.example_id: reason for d, reason in result.dropped}
    frame = pd.DataFrame([d.to_row() | {"kept": d.example_id in kept_ids,
                                        "drop_reason": reasons.get(d.example_id),
                                        "policy_fingerprint": policy_fingerprint,
                                        "data_fingerprint": data_fingerprint}
                          for d in difficulties])
    difficulty_path = out_dir / "difficulty.parquet"
    tmp = difficulty_path.with_suffix(".parquet.tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(difficulty_path)
    dropped_path = out_dir / "dropped.jsonl"
    write_jsonl(dropped_path, [by_id[d.example_id].model_dump(mode="json")
                               | {"pass_rate": d.pass_rate, "reason": r}
                               for d, r in result.dropped])
    hist = out_dir / "difficulty_hist.png"
    _plot_histogram(difficulties, hist)
    train_path = out_dir / "train_curriculum.jsonl"
    write_jsonl(train_path, [by_id[d.example_id] for d in result.kept] + list(unestimated))
    mean = sum(d.pass_rate for d in difficulties) / max(len(difficulties), 1)
    counts = result.counts | {"not_estimated_kept": len(unestimated),
                              "train_questions": len(result.kept) + len(unestimated)}
    atomic_write_text(out_dir / "counts.json", json.dumps(counts, indent=2))
    return CurriculumResult(train_path=train_path, difficulty_path=difficulty_path,
                            dropped_path=dropped_path, histogram_path=hist,
                            counts=counts, mean_pass_rate=mean)


def cold_start_pass_at_k(curriculum_dir: Path) -> dict[str, Any] | None:
    """pass@k (share of estimated questions with at least one correct of their k samples) and
    pass@1 (the mean share correct) of the policy the curriculum stage estimated with, from its
    `difficulty.parquet` (one row per question: samples, pass_rate, policy_fingerprint); None
    when the dir holds no estimate."""
    path = curriculum_dir / "difficulty.parquet"
    if not path.is_file():
        return None
    import pandas as pd

    frame = pd.read_parquet(path)
    if frame.empty:
        return None
    return {"questions": len(frame), "k": sorted({int(k) for k in frame["samples"]}),
            "pass_at_k": float((frame["pass_rate"] > 0).mean()),
            "pass_at_1": float(frame["pass_rate"].mean()),
            "policy_fingerprints": sorted(set(frame["policy_fingerprint"]))}


def run_curriculum(config: PipelineConfig, train_path: Path, policy_dir: Path,
                   searcher: Searcher, out_dir: Path) -> CurriculumResult:
    """Estimate difficulty with the policy in `policy_dir`, filter, order, write artifacts.

    With `curriculum.enabled: false` every question is kept in its original order (the
    difficulty is still measured, so the unfiltered baseline is documented the same way).
    """
    cfg = config.curriculum
    all_examples = read_qa(train_path)
    # Beyond the estimation cap questions are kept unestimated, after the ordered ones:
    # capping the cost of estimation must never silently shrink the training set.
    cap = len(all_examples) if cfg.max_questions is None else cfg.max_questions
    examples, unestimated = all_examples[:cap], all_examples[cap:]
    generator = make_generator(config, policy_dir=policy_dir)
    records = rollout_pass_rates(examples, generator, searcher, config, cfg.samples_per_question)
    difficulties = estimate_difficulty(examples, records)
    if cfg.enabled:
        result = filter_by_difficulty(difficulties, min_pass_rate=cfg.min_pass_rate,
                                      max_pass_rate=cfg.max_pass_rate, order=cfg.order,
                                      seed=config.run.seed)
    else:
        result = FilterResult(kept=list(difficulties), dropped=[],
                              counts={"questions_in": len(difficulties),
                                      "kept": len(difficulties), "dropped": 0,
                                      "dropped_never_solved": 0, "dropped_always_solved": 0})
    written = write_artifacts(examples, result, difficulties, out_dir,
                              policy_fingerprint=fingerprint(policy_dir),
                              data_fingerprint=fingerprint(train_path), unestimated=unestimated)
    written.records = records
    return written
