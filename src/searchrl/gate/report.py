"""Stage 6 library entry: evaluation results + training facts + config -> the gate decision and
its report files. Never raises on bad numbers: anything missing or non-finite reaches the gate
as None/NaN and fails closed there, named in the report.

Writes under `out_dir`: report.html, report.md, decision.json (atomically; decision.json last).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.config import PipelineConfig
from searchrl.data.io import atomic_write_text, read_manifest
from searchrl.eval.baselines import TRAINED
from searchrl.eval.metrics import Interval
from searchrl.eval.run import EvalResult
from searchrl.gate.payback import CostInputs, GateInputs, GateResult, GateThresholds, decide
from searchrl.gate.render import ReportInputs, render_html, render_markdown


@dataclass(frozen=True)
class GateOutcome:
    result: GateResult
    report: ReportInputs
    html_path: Path
    md_path: Path
    decision_path: Path
    figures: dict[str, float]


def count_rows(path: str | Path | None) -> int | None:
    """Rows of a JSONL dataset file (from its manifest when valid); None when unreadable."""
    if path is None or not Path(path).is_file():
        return None
    manifest = read_manifest(path)
    if manifest is not None:
        return int(manifest["rows"])
    with Path(path).open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def load_training_curve(path: str | Path | None, metrics: tuple[str, ...]
                        ) -> dict[str, list[tuple[int, float]]]:
    """Per-step values of the wanted metrics from the trainer's metrics JSONL.

    A key matches metric `m` when it equals `m` or ends with `/m` or `.m` (trainers prefix
    names). Unreadable lines and non-finite values are skipped: the plot is context, not a
    gate input. A missing file gives an empty curve (the plot says so).
    """
    curve: dict[str, list[tuple[int, float]]] = {}
    if path is None or not Path(path).is_file():
        return curve
    with Path(path).open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            step = row.get("step", i)
            for key, value in row.items():
                if not isinstance(value, int | float) or not math.isfinite(value):
                    continue
                if any(key == m or key.endswith((f"/{m}", f".{m}")) for m in metrics):
                    curve.setdefault(key, []).append((int(step), float(value)))
    return curve


def choose_baseline(evaluation: EvalResult, wanted: str) -> tuple[str, list[str]]:
    """The baseline the accuracy condition compares with, and notes.

    `best`: the evaluated baseline with the highest EM (the hardest bar to clear). A named
    baseline that was not evaluated is returned as is; the gate then fails closed on it.
    """
    baselines = {n: s for n, s in evaluation.systems.items() if n != TRAINED}
    if wanted != "best":
        if wanted not in baselines:
            return wanted, [f"gate.comparison_baseline={wanted!r} was not evaluated "
                            f"(evaluated: {sorted(baselines)}): accuracy cannot be checked"]
        return wanted, []
    finite = {n: s.summary.em.mean for n, s in baselines.items()
              if math.isfinite(s.summary.em.mean)}
    if not finite:
        return "best", ["no baseline has a finite EM: accuracy cannot be checked"]
    best = max(sorted(finite), key=lambda n: finite[n])
    return best, [f"comparison baseline: {best}, the strongest evaluated baseline by EM "
                  "(gate.comparison_baseline=best)"]


def build_gate(config: PipelineConfig, evaluation: EvalResult, *, gold_pairs: int | None,
               training_seconds: float | None,
               training_curve: Mapping[str, list[tuple[int, float]]],
               ) -> tuple[GateResult, ReportInputs]:
    """Assemble the gate inputs (config first, measurements where config leaves None)."""
    g = config.gate
    notes: list[str] = list(evaluation.notes)
    baseline, more = choose_baseline(evaluation, g.comparison_baseline)
    notes += more
    delta = evaluation.deltas.get(baseline, Interval(math.nan, math.nan, math.nan, 0))
    trained = evaluation.systems.get(TRAINED)
    measured_tokens = trained.summary.tokens_per_query if trained is not None else math.nan
    hours = g.training_gpu_hours
    if hours is None:
        # 0 s means "not measured" (the CheckpointRef default): never a free training run.
        hours = training_seconds / 3600.0 if training_seconds and training_seconds > 0 else None
        notes.append("training GPU-hours measured by the training stage" if hours is not None
                     else "training time was not recorded: payback cannot be computed")
    costs = CostInputs(
        gpu_type=g.gpu_type, gpu_price_per_hour=g.gpu_price_per_hour, training_gpu_hours=hours,
        production_queries_per_month=g.production_queries_per_month,
        small_tokens_per_query=(g.small_model_tokens_per_query
                                if g.small_model_tokens_per_query is not None
                                else measured_tokens),
        small_price_per_1k_tokens=g.small_model_price_per_1k_tokens,
        frontier_tokens_per_query=g.frontier_tokens_per_query,
        frontier_price_per_1k_tokens=g.frontier_price_per_1k_tokens)
    thresholds = GateThresholds(min_gold_pairs=g.min_gold_pairs,
                                min_accuracy_margin=g.min_accuracy_margin,
                                max_payback_months=g.max_payback_months)
    result = decide(GateInputs(gold_pairs=gold_pairs, accuracy_delta=delta.mean,
                               accuracy_delta_lo=delta.lo, accuracy_delta_hi=delta.hi,
                               comparison_baseline=baseline, costs=costs), thresholds)
    notes.append("The frontier model's accuracy is not measured here: the accuracy condition "
                 f"uses {baseline} (same eval set, same retriever) as its stand-in; its cost "
                 "side uses the configured frontier tokens and prices.")
    notes.append(f"Latency is batch-amortised wall time on device={config.run.device} "
                 f"(eval.batch_size={config.eval.batch_size}).")
    order = [n for n in evaluation.systems if n != TRAINED] + [TRAINED] * (trained is not None)
    suspects = _read_jsonl(evaluation.suspects_path)
    report = ReportInputs(
        title=f"searchrl go/no-go: {config.run.name}", gate=result, thresholds=thresholds,
        costs=costs, gold_pairs=gold_pairs, comparison_baseline=baseline, trained_name=TRAINED,
        eval_set=f"{evaluation.eval_set} ({evaluation.n_questions} questions)",
        systems={n: evaluation.systems[n].summary for n in order},
        by_hops={n: evaluation.systems[n].by_hops for n in order},
        by_type={TRAINED: trained.by_type} if trained is not None else {},
        searched_split={n: evaluation.systems[n].by_searched for n in order
                        if evaluation.systems[n].spec.mode == "agentic"},
        deltas=dict(evaluation.deltas), training_curve=dict(training_curve), suspects=suspects,
        payback_horizon_months=g.payback_horizon_months, notes=tuple(notes))
    return result, report


def _read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    if not Path(path).is_file():
        return []
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def decision_figures(result: GateResult, report: ReportInputs) -> dict[str, float]:
    """The headline numbers (NaN where unavailable), for MLflow metrics and the Decision."""
    trained = report.systems.get(report.trained_name)
    base = report.systems.get(report.comparison_baseline)
    delta = report.deltas.get(report.comparison_baseline)
    p = result.payback
    nan = math.nan
    return {
        "go": float(result.go),
        "em_trained": trained.em.mean if trained else nan,
        "em_baseline": base.em.mean if base else nan,
        "em_delta": delta.mean if delta else nan,
        "em_delta_lo": delta.lo if delta else nan,
        "em_delta_hi": delta.hi if delta else nan,
        "gold_pairs": float(report.gold_pairs) if report.gold_pairs is not None else nan,
        "tokens_per_query": (report.costs.small_tokens_per_query
                             if report.costs.small_tokens_per_query is not None else nan),
        "training_cost": p.training_cost if p else nan,
        "monthly_saving": p.monthly_saving if p else nan,
        "payback_months": p.payback_months if p else nan,
        "suspect_labels": float(len(report.suspects)),
    }


def write_gate_report(config: PipelineConfig, evaluation: EvalResult, out_dir: Path, *,
                      gold_pairs: int | None, training_seconds: float | None,
                      metrics_path: str | Path | None) -> GateOutcome:
    """Decide, render, write. decision.json is removed first and written last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    decision_path = out_dir / "decision.json"
    decision_path.unlink(missing_ok=True)
    curve = load_training_curve(metrics_path, config.gate.training_curve_metrics)
    result, report = build_gate(config, evaluation, gold_pairs=gold_pairs,
                                training_seconds=training_seconds, training_curve=curve)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    atomic_write_text(html_path, render_html(report))
    atomic_write_text(md_path, render_markdown(report))
    figures = decision_figures(result, report)
    atomic_write_text(decision_path, json.dumps(
        {**result.to_dict(), "reasons": list(result.reasons),
         "comparison_baseline": report.comparison_baseline, "figures": figures,
         "notes": list(report.notes)}, indent=2))
    return GateOutcome(result=result, report=report, html_path=html_path, md_path=md_path,
                       decision_path=decision_path, figures=figures)

