"""Stage 5 library entry: every system on the same eval questions and retriever, greedy, with
the training rollout loop; metrics with bootstrap intervals; the label-noise audit.

Writes under `out_dir` (each file atomically; `results.json` last, so its presence means the
evaluation is complete):

    questions_<system>.jsonl     one QuestionResult per question (with a manifest)
    trajectories_<system>.jsonl  the decoded trajectory, answer, queries per question
    suspect_labels.jsonl         the audit's suspect gold labels (with a manifest)
    results.json                 summaries, breakdowns, paired deltas, notes (EvalResult)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.data.io import atomic_write_text, read_qa, write_jsonl
from searchrl.eval.audit import final_turn_confidence, find_suspects, retrieved_ids
from searchrl.eval.baselines import TRAINED, SystemSpec, plan_systems, system_policy
from searchrl.eval.metrics import (
    Interval,
    QuestionResult,
    Summary,
    align,
    breakdown,
    by_hops,
    by_searched,
    by_type,
    paired_bootstrap_delta,
    summarize,
)
from searchrl.generation.factory import make_generator
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.index_store import load_searcher
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rewards import exact_match, f1
from searchrl.rl.rollout import run_rollouts
from searchrl.types import QAExample

RESULTS_FILE = "results.json"


def to_question_result(rec: RolloutRecord, ex: QAExample, latency_s: float) -> QuestionResult:
    """Reduce one greedy trajectory to its metrics.

    EM/F1 are recomputed from the extracted answer (whatever `reward.kind` trained on);
    `searches` counts the policy's own searches (retrieve_once's template retrieval is not
    one); input tokens are the prompt plus everything inserted (information, glue), response
    tokens are what the policy generated.
    """
    answer = rec.answer
    sampled = sum(rec.loss_mask)
    support = None
    if ex.supporting_doc_ids:
        got = set(retrieved_ids(rec))
        support = any(d in got for d in ex.supporting_doc_ids)
    return QuestionResult(
        example_id=ex.id, hops=ex.hops, qtype=ex.type,
        em=exact_match(answer, ex.golden_answers) if answer is not None else 0.0,
        f1=f1(answer, ex.golden_answers) if answer is not None else 0.0,
        searches=0 if rec.mode == "retrieve_once" else len(rec.queries),
        format_ok=rec.reward_parts.get("format", 0.0) >= 1.0,
        prompt_tokens=len(rec.prompt_ids) + len(rec.response_ids) - sampled,
        response_tokens=sampled, latency_s=latency_s,
        answered=bool(answer and answer.strip()), finish_reason=rec.finish_reason,
        answer=answer, retrieved_support=support, confidence=final_turn_confidence(rec),
        search_errors=rec.search_errors,
    )


@dataclass(frozen=True)
class SystemResult:
    spec: SystemSpec
    summary: Summary
    by_hops: dict[str, Summary]
    by_type: dict[str, Summary]
    by_searched: dict[str, Summary]
    questions_path: str
    trajectories_path: str
    seconds: float


def _interval_from(d: Mapping[str, Any]) -> Interval:
    return Interval(float(d["mean"]), float(d["lo"]), float(d["hi"]), int(d["n"]),
                    float(d.get("level", 0.95)))


def summary_from_dict(d: Mapping[str, Any]) -> Summary:
    """Inverse of `Summary.to_dict` (JSON turns NaN into NaN, so round trips are exact)."""
    rest = {k: v for k, v in d.items() if k not in ("em", "f1")}
    return Summary(em=_interval_from(d["em"]), f1=_interval_from(d["f1"]), **rest)


@dataclass(frozen=True)
class EvalResult:
    """What the gate and the report read: per-system summaries and paired EM deltas of the
    trained policy against each baseline (on the questions both answered)."""

    eval_set: str
    n_questions: int
    systems: dict[str, SystemResult]
    deltas: dict[str, Interval]
    suspects_path: str
    n_suspects: int
    notes: tuple[str, ...] = ()
    level: float = 0.95

    def to_dict(self) -> dict[str, Any]:
        return {
            "eval_set": self.eval_set, "n_questions": self.n_questions, "level": self.level,
            "systems": {n: {"name": s.spec.name, "policy": s.spec.policy, "mode": s.spec.mode,
                            "description": s.spec.description,
                            "summary": s.summary.to_dict(),
                            "by_hops": {k: v.to_dict() for k, v in s.by_hops.items()},
                            "by_type": {k: v.to_dict() for k, v in s.by_type.items()},
                            "by_searched": {k: v.to_dict() for k, v in s.by_searched.items()},
                            "questions_path": s.questions_path,
                            "trajectories_path": s.trajectories_path, "seconds": s.seconds}
                        for n, s in self.systems.items()},
            "deltas": {k: v.to_dict() for k, v in self.deltas.items()},
            "suspects_path": self.suspects_path, "n_suspects": self.n_suspects,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalResult:
        systems = {}
        for name, s in d["systems"].items():
            spec = SystemSpec(s["name"], s["policy"], s["mode"], s["description"])
            systems[name] = SystemResult(
                spec=spec, summary=summary_from_dict(s["summary"]),
                by_hops={k: summary_from_dict(v) for k, v in s["by_hops"].items()},
                by_type={k: summary_from_dict(v) for k, v in s["by_type"].items()},
                by_searched={k: summary_from_dict(v) for k, v in s["by_searched"].items()},
                questions_path=s["questions_path"], trajectories_path=s["trajectories_path"],
                seconds=float(s["seconds"]))
        return cls(eval_set=d["eval_set"], n_questions=int(d["n_questions"]), systems=systems,
                   deltas={k: _interval_from(v) for k, v in d["deltas"].items()},
                   suspects_path=d["suspects_path"], n_suspects=int(d["n_suspects"]),
                   notes=tuple(d.get("notes", ())), level=float(d.get("level", 0.95)))


def load_eval_result(path: str | Path) -> EvalResult:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no evaluation results; run the evaluate_policy stage")
    return EvalResult.from_dict(json.loads(path.read_text()))


def read_question_results(path: str | Path) -> list[QuestionResult]:
    with Path(path).open(encoding="utf-8") as fh:
        return [QuestionResult.from_dict(json.loads(line)) for line in fh if line.strip()]


@dataclass
class _SystemRun:
    results: list[QuestionResult] = field(default_factory=list)
    records: list[RolloutRecord] = field(default_factory=list)
    seconds: float = 0.0


def _run_system(spec: SystemSpec, examples: Sequence[QAExample], searcher: Searcher,
                config: PipelineConfig,
                progress: Callable[[str, int, int], None] | None) -> _SystemRun:
    generator = make_generator(config, **system_policy(spec, config))
    out = _SystemRun()
    step = config.eval.batch_size
    for start in range(0, len(examples), step):
        chunk = examples[start:start + step]
        t0 = time.perf_counter()
        batch = run_rollouts(chunk, generator, searcher, config.rollout, config.reward,
                             group_size=1, greedy=True, seed=config.run.seed, mode=spec.mode)
        per_question = (time.perf_counter() - t0) / len(chunk)
        out.seconds += per_question * len(chunk)
        by_id = {ex.id: ex for ex in chunk}
        for rec in batch.records:
            out.records.append(rec)
            out.results.append(to_question_result(rec, by_id[rec.example_id], per_question))
        if progress is not None:
            progress(spec.name, min(start + step, len(examples)), len(examples))
    return out


def _trajectory_row(rec: RolloutRecord) -> dict[str, Any]:
    return {"example_id": rec.example_id, "mode": rec.mode, "answer": rec.answer,
            "correct": rec.correct, "queries": rec.queries,
            "retrieved_doc_ids": rec.retrieved_doc_ids, "finish_reason": rec.finish_reason,
            "reward_parts": rec.reward_parts, "text": rec.text}


def evaluate(examples: Sequence[QAExample], systems: Sequence[SystemSpec], searcher: Searcher,
             config: PipelineConfig, out_dir: Path, *, eval_set: str,
             notes: Sequence[str] = (),
             progress: Callable[[str, int, int], None] | None = None) -> EvalResult:
    """Run every system greedily on `examples`; write the files in the module docstring.

    `systems` must include `trained` (the deltas are trained minus each baseline). Suspects
    are pooled over every agentic system, one row per question, naming the systems that
    flagged it (a label several policies disagree with is the stronger suspect).
    """
    if not examples:
        raise ValueError(f"eval set {eval_set!r} is empty: nothing to evaluate")
    if TRAINED not in {s.name for s in systems}:
        raise ValueError("evaluate: the systems must include the trained policy")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS_FILE).unlink(missing_ok=True)
    cfg = config.eval
    samples, level, seed = cfg.bootstrap_samples, cfg.confidence_level, config.run.seed
    by_id = {ex.id: ex for ex in examples}
    runs: dict[str, SystemResult] = {}
    per_question: dict[str, list[QuestionResult]] = {}
    pooled: dict[str, dict[str, Any]] = {}
    for spec in systems:
        run = _run_system(spec, examples, searcher, config, progress)
        qpath = out_dir / f"questions_{spec.name}.jsonl"
        tpath = out_dir / f"trajectories_{spec.name}.jsonl"
        write_jsonl(qpath, [r.to_dict() for r in run.results])
        write_jsonl(tpath, [_trajectory_row(r) for r in run.records])
        per_question[spec.name] = run.results
        runs[spec.name] = SystemResult(
            spec=spec, summary=summarize(run.results, samples=samples, level=level, seed=seed),
            by_hops=breakdown(run.results, by_hops, samples=samples, level=level, seed=seed),
            by_type=breakdown(run.results, by_type, samples=samples, level=level, seed=seed),
            by_searched=breakdown(run.results, by_searched, samples=samples, level=level,
                                  seed=seed),
            questions_path=str(qpath), trajectories_path=str(tpath), seconds=run.seconds)
        if spec.mode == "agentic":
            for s in find_suspects(run.records, by_id, min_confidence=cfg.audit_min_confidence,
                                   system=spec.name):
                row = pooled.setdefault(s["example_id"], {**s, "flagged_by": []})
                row["flagged_by"].append(spec.name)
                row["confidence"] = max(row["confidence"], s["confidence"])
                row["answer_in_support"] = row["answer_in_support"] or s["answer_in_support"]
    trained = per_question[TRAINED]
    deltas = {}
    for name, results in per_question.items():
        if name == TRAINED:
            continue
        a, b = align(trained, results)
        deltas[name] = paired_bootstrap_delta([r.em for r in a], [r.em for r in b],
                                              samples=samples, level=level, seed=seed)
    suspects = sorted(pooled.values(), key=lambda s: (-len(s["flagged_by"]),
                                                       not s["answer_in_support"],
                                                       -s["confidence"], s["example_id"]))
    spath = out_dir / "suspect_labels.jsonl"
    write_jsonl(spath, suspects)
    result = EvalResult(eval_set=eval_set, n_questions=len(examples), systems=runs,
                        deltas=deltas, suspects_path=str(spath), n_suspects=len(suspects),
                        notes=tuple(notes), level=cfg.confidence_level)
    atomic_write_text(out_dir / RESULTS_FILE, json.dumps(result.to_dict(), indent=2))
    return result


# --- the stage entry


def evaluate_stage(config: PipelineConfig, *, eval_path: str | Path, index_dir: str | Path,
                   policy_dir: str, sft_dir: str | None, out_dir: Path,
                   tracking_uri: str | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> EvalResult:
    """Evaluate the trained policy and the configured baselines on `eval_path`.

    The champion baseline is looked up in the model registry of `tracking_uri` (skipped with
    a note when there is none, or no tracking store).
    """
    examples = read_qa(eval_path)
    if config.eval.max_questions is not None:
        examples = examples[: config.eval.max_questions]
    champion_dir: str | None = None
    if "champion" in config.eval.baselines and tracking_uri is not None:
        # Imported here: only the registry lookup needs mlflow, and the library stays
        # importable without it (tests/unit/test_architecture.py).
        from searchrl.tracking import download_registered_policy

        got = download_registered_policy(tracking_uri, config.eval.registry_model_name,
                                         config.eval.champion_alias, out_dir / "champion")
        champion_dir = str(got) if got is not None else None
    systems, notes = plan_systems(config.eval.baselines, policy_dir=policy_dir,
                                  sft_dir=sft_dir, champion_dir=champion_dir, config=config)
    searcher = load_searcher(Path(index_dir), config.index)
    return evaluate(examples, systems, searcher, config, out_dir,
                    eval_set=f"{config.eval.split}:{Path(eval_path).name}", notes=notes,
                    progress=progress)

